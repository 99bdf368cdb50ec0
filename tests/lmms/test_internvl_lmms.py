"""The lmms-eval model answers on an InternVL checkpoint (a tiny one in a local folder): one image,
several images and a video path, pruned by MI and by an in-LLM method."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("lmms_eval")

from mipruner.media import write_video  # noqa: E402
from tests.models.tiny_internvl import save_tiny  # noqa: E402
from tests.models.tiny_llava import scene  # noqa: E402


@pytest.mark.parametrize("method", ["mi", "fastv"])
def test_internvl_lmms_model_answers(tmp_path, method):
    from mipruner.lmms.model import MiPruner

    path = save_tiny(str(tmp_path / "iv"))
    video = write_video([scene(48, 32, seed=i) for i in range(6)], str(tmp_path / "v.mp4"))
    docs = {0: [scene(60, 40)], 1: [scene(30, 30, seed=1), scene(40, 20, seed=2)], 2: [video]}
    model = MiPruner(pretrained=path, method=method, budget="25%", device="cpu")
    assert model.adapter.family == "internvl"
    model.task_dict = {"t": {"test": docs}}
    reqs = [SimpleNamespace(args=("What colour is the square?", {"max_new_tokens": 2, "until": []},
                                  lambda doc: doc, i, "t", "test")) for i in docs]
    out = model.generate_until(reqs)
    assert len(out) == 3 and all(isinstance(t, str) for t in out) and model.calls == 3
