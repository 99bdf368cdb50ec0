"""The lmms-eval model encodes `batch_size` requests per vision-tower call (LLaVA-1.5, one image each:
`mipruner.serve.batch.encode_items`) and gives the answers of batch_size=1, in request order."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("lmms_eval")

from tests.models.test_encode_batch import TowerCalls  # noqa: E402
from tests.models.tiny_llava import save_tiny, scene  # noqa: E402


def test_requests_share_tower_calls(tmp_path):
    from mipruner.lmms.answer import compute_summary
    from mipruner.lmms.model import MiPruner

    path = save_tiny("llava", str(tmp_path / "llava"))
    docs = {i: [scene(60 + 7 * i, 40, square=(5 * i, 5, 5 * i + 12, 20), seed=i)] for i in range(5)}
    reqs = [SimpleNamespace(args=("What colour is the square?", {"max_new_tokens": 3, "until": []},
                                  lambda doc: doc, i, "t", "test")) for i in docs]
    answers = {}
    for batch in (3, 1):
        model = MiPruner(pretrained=path, method="mi", budget="25%", device="cpu", batch_size=batch)
        model.task_dict = {"t": {"test": docs}}
        with TowerCalls(model.adapter) as calls:
            answers[batch] = model.generate_until(reqs)
        assert calls.n == math.ceil(len(reqs) / batch) and model.calls == len(reqs)
        # each answer's prefill compute, logged as one line at the end of the run (`compute_summary`)
        assert len(model.computes) == len(reqs) and all(0 < c.flops_share < 1 for c in model.computes)
        assert compute_summary(model.computes).startswith("prefill FLOPs ")
    assert answers[3] == answers[1]
