"""What a visitor may load: the allow-list (the dropdown's models when hosted, any id when local), the
size cap read from the hub's metadata before anything is downloaded (the metadata call is replaced
here: no network), local folders only from those named at start-up, and never trust_remote_code."""
from __future__ import annotations

import ast
import os
from types import SimpleNamespace

import pytest

import app
from components.hosting.hub import EMBEDDED, SUGGESTED, ModelHub
from components.hosting.policy import ModelPolicy, hub_checkpoint_bytes, is_hosted

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GB = 10**9


def sib(name, size):
    return SimpleNamespace(rfilename=name, size=size)


FAKE_HUB = {  # repo -> what huggingface_hub.model_info(files_metadata=True) would say
    "llava-hf/llava-1.5-7b-hf": SimpleNamespace(siblings=[
        sib("config.json", 950), sib("model-00001-of-00003.safetensors", 4_900_000_000),
        sib("model-00002-of-00003.safetensors", 4_900_000_000), sib("model-00003-of-00003.safetensors", 4_300_000_000),
        sib("pytorch_model.bin", 14 * GB)], safetensors=None),
    "Qwen/Qwen2-VL-72B-Instruct": SimpleNamespace(siblings=[sib(f"model-{i:05d}-of-00038.safetensors", 3_900_000_000)
                                                            for i in range(38)], safetensors=None),
    "old/bin-only": SimpleNamespace(siblings=[sib("pytorch_model.bin", 2 * GB), sib("tf_model.h5", 9 * GB)],
                                    safetensors=None),
    "new/no-sizes": SimpleNamespace(siblings=[sib("model.safetensors", None)],
                                    safetensors=SimpleNamespace(parameters={"BF16": 3_000_000_000, "F32": 1000})),
}


@pytest.fixture()
def fake_hub(monkeypatch):
    import huggingface_hub

    calls = []

    def model_info(repo_id, files_metadata=False, timeout=None, **kw):
        calls.append(repo_id)
        assert files_metadata
        if repo_id not in FAKE_HUB:
            raise ConnectionError("no network in tests")
        return FAKE_HUB[repo_id]

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr("components.hosting.policy.cached_locally", lambda repo: repo == "cached/offline-model")
    return calls


def test_checkpoint_size_from_hub_metadata(fake_hub):
    assert hub_checkpoint_bytes("llava-hf/llava-1.5-7b-hf") == 14_100_000_000  # safetensors only, not the .bin copy
    assert hub_checkpoint_bytes("old/bin-only") == 2 * GB  # no safetensors: the .bin (never the TF file)
    assert hub_checkpoint_bytes("new/no-sizes") == 6_000_004_000  # parameter counts x dtype bytes
    assert fake_hub == ["llava-hf/llava-1.5-7b-hf", "old/bin-only", "new/no-sizes"]


def hub_with(policy, loaded):
    def loader(name, device, dtype):
        loaded.append(name)
        if name != EMBEDDED:
            raise OSError("not loading real checkpoints in tests")
        import mipruner

        return mipruner.load(name, device="cpu")

    h = ModelHub(EMBEDDED, loader=loader, policy=policy)
    h.load_default()
    return h


def test_size_cap_refuses_before_any_download(fake_hub):
    loaded = []
    h = hub_with(ModelPolicy(max_bytes=30 * GB), loaded)
    engine, note = h.get("Qwen/Qwen2-VL-72B-Instruct")
    assert engine.model_name == EMBEDDED and "Could not load 'Qwen/Qwen2-VL-72B-Instruct'" in note
    assert "its checkpoint is 148.2 GB; this server loads checkpoints of at most 30.0 GB" in note
    assert "Showing the embedded model" in note
    _, note = h.get("llava-hf/llava-1.5-7b-hf")  # under the cap: handed to the loader
    _, note2 = h.get("nobody/unreachable")  # metadata unreadable and not cached: refused
    _, note3 = h.get("cached/offline-model")  # metadata unreadable but cached: nothing to download
    assert "size cannot be read from the model hub" in note2
    assert loaded == [EMBEDDED, "llava-hf/llava-1.5-7b-hf", "cached/offline-model"]


def _allow_list_notes(fake_hub, base):
    """The notes a visitor gets for each name, with the allowed folder under `base`."""
    (base / "models" / "mine").mkdir(parents=True)
    (base / "secret").mkdir()
    loaded = []
    policy = ModelPolicy(allow=("llava-hf/*", "Qwen/Qwen2-VL-2B-Instruct"), max_bytes=30 * GB,
                         model_dirs=(str(base / "models"),))
    h = hub_with(policy, loaded)
    notes = {n: h.get(n)[1] for n in ("Qwen/Qwen2-VL-72B-Instruct", str(base / "secret"),
                                      str(base / "models" / ".." / "secret"), "../secret", "bad id!",
                                      str(base / "models" / "mine"), "llava-hf/llava-1.5-7b-hf", EMBEDDED)}
    return notes, loaded


# the visitor's own path is quoted up to 60 characters (components.core.messages.short): folders of several
# depths put that cut before, at and after the end of the base folder, whatever pytest's temp folder is
@pytest.mark.parametrize("depth", [0, 1, 2, 5, 9])
def test_allow_list_and_local_folders(fake_hub, tmp_path, depth):
    from components.core.messages import short

    base = tmp_path.joinpath(*["d"] * depth)
    notes, loaded = _allow_list_notes(fake_hub, base)
    assert ("this server only loads these models: llava-hf/*, Qwen/Qwen2-VL-2B-Instruct"
            in notes["Qwen/Qwen2-VL-72B-Instruct"])
    for n in (str(base / "secret"), str(base / "models" / ".." / "secret"), "../secret"):
        assert "only from the folders it was started with" in notes[n], n
        rest = notes[n].replace(short(n), "").replace(repr(n), "")  # what the note says besides the visitor's input
        assert str(base / "models") not in rest and str(tmp_path) not in rest, rest  # the folders are not named
    assert "neither a model id" in notes["bad id!"]
    assert loaded == [EMBEDDED, str(base / "models" / "mine"), "llava-hf/llava-1.5-7b-hf"]
    assert notes[EMBEDDED] == ""
    no_dirs = ModelPolicy()
    assert "no models from local folders" in no_dirs.refusal("/etc")


def test_hosted_or_local_defaults():
    assert not is_hosted("127.0.0.1", env={}) and not is_hosted("localhost", env={}) and not is_hosted("::1", env={})
    assert is_hosted("0.0.0.0", env={}) and is_hosted("192.168.1.5", env={}) and is_hosted("myhost", env={})
    assert is_hosted("127.0.0.1", env={"SPACE_ID": "me/app"}) and is_hosted("127.0.0.1", share=True, env={})
    hosted = app.model_policy(app.parse_args(["--host", "0.0.0.0"]))
    assert hosted.allow == SUGGESTED and hosted.max_bytes == 30 * GB and hosted.model_dirs == ()
    local = app.model_policy(app.parse_args(["--host", "127.0.0.1"]))
    assert local.allow is None and local.max_bytes == 30 * GB
    custom = app.model_policy(app.parse_args(["--host", "0.0.0.0", "--allow-models", "llava-hf/*, my/model",
                                              "--max-model-gb", "0", "--model-dirs", f"/models{os.pathsep}/data"]))
    assert custom.allow == ("llava-hf/*", "my/model") and custom.max_bytes is None
    assert custom.model_dirs == ("/models", "/data")
    assert app.model_policy(app.parse_args(["--host", "0.0.0.0", "--allow-models", "*"])).allow is None
    started = app.model_policy(app.parse_args(["--host", "0.0.0.0", "--model", "/srv/private/model"]))
    assert started.refusal("/srv/private/model") == ""  # the operator's start-up model is trusted


def test_models_load_without_trust_remote_code(monkeypatch):
    import components.hosting.hub as hub_module

    seen = []

    real = hub_module.load_adapter

    def load_adapter(name, **kw):
        seen.append(kw)
        if name != EMBEDDED:
            raise OSError("not loading real checkpoints in tests")
        return real(name, **kw)

    monkeypatch.setattr(hub_module, "load_adapter", load_adapter)
    ModelHub(EMBEDDED).get("llava-hf/llava-1.5-7b-hf")
    assert seen and all(set(kw) <= {"device", "dtype"} for kw in seen)
    hits = []
    for base in ("mipruner", "components"):
        for d, _, files in os.walk(os.path.join(ROOT, base)):
            for f in (f for f in files if f.endswith(".py")):
                for node in ast.walk(ast.parse(open(os.path.join(d, f)).read())):
                    if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                        hits.append(os.path.join(d, f))
    assert hits == []
