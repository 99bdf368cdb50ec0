"""Start-up without a reachable hub: the start-up model is given up at once (no retries of the hub
client) and the embedded model serves, with the same one sentence as when HF_HUB_OFFLINE is set."""
from __future__ import annotations

from components.hosting.hub import EMBEDDED, OFFLINE, ModelHub, hub_reachable
from mipruner.serve.service import load_adapter


def test_an_unreachable_hub_is_told_without_waiting_for_it(monkeypatch):
    for v in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(v, raising=False)
    assert hub_reachable(timeout=2, endpoint="http://127.0.0.1:1") is False  # nothing listens on port 1
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable(endpoint="http://127.0.0.1:1") is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub_reachable(endpoint="http://127.0.0.1:1") is True  # behind a proxy the load itself finds out


def test_the_start_up_model_falls_back_at_once_when_the_hub_is_unreachable():
    asked = []

    def loader(name, device, dtype):
        asked.append(name)
        if name != EMBEDDED:
            raise AssertionError("the hub model must not be tried when the hub cannot be reached")
        return load_adapter(name, device="cpu")

    hub = ModelHub("someone/not-cached-model", loader=loader, device="cpu")
    msg = hub.load_default("this Space's default on a CPU", reachable=lambda: False)
    assert msg == (f"Could not load 'someone/not-cached-model', this Space's default on a CPU, because {OFFLINE}, "
                   f"so the embedded model {EMBEDDED!r} serves instead.")
    assert asked == [EMBEDDED] and hub.default == EMBEDDED
    asked.clear()  # reachable: the model is tried (and here fails in its loader, then the fallback serves)
    ModelHub("someone/not-cached-model", loader=loader, device="cpu").load_default(reachable=lambda: True)
    assert asked == ["someone/not-cached-model", EMBEDDED]
