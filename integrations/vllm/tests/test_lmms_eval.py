"""lmms-eval's own vLLM model (`--model vllm`, lmms_eval/models/simple/vllm.py `VLLM`) with the plug-in, on the
repository's shapes task (`mipruner.lmms.make_tasks`), offline on the CPU: the engine-level fields in its
`model_args` prune every item (DivPrune: each image's own selection) (lmms-eval sends no per-request fields), each item's kept indices equal
`mipruner.select` on the same image, and lmms-eval writes its score.

In-process (conftest: VLLM_ENABLE_V1_MULTIPROCESSING=0), so the worker's selections are readable here.
"""
from __future__ import annotations

import gc
import json

import mipruner
from mipruner_vllm import select as worker

from conftest import ENGINE, FAMILIES, LIMITS

N_ITEMS, SEED, METHOD, BUDGET = 4, 1234, "divprune", 5  # 4 open questions; DivPrune (reads no query) at 5


def model_args(path) -> str:
    """lmms-eval's `--model_args` for the tiny Qwen2.5-VL: the plug-in's architecture and its fields, as JSON
    strings (lmms-eval parses a value in braces), and the suite's CPU engine settings."""
    fields = {"mipruner_method": METHOD, "mipruner_budget": BUDGET}
    parts = [f"model={path}", "hf_overrides=" + json.dumps({"architectures": [FAMILIES["qwen2_5_vl"][1]]}),
             "mm_processor_kwargs=" + json.dumps(fields), "limit_mm_per_prompt=" + json.dumps(LIMITS["qwen2_5_vl"]),
             "max_new_tokens=4"] + [f"{k}={v}" for k, v in ENGINE.items() if k != "seed"]  # lmms-eval sets seed=1
    return ",".join(parts)


def test_lmms_evals_vllm_model_prunes_every_item_as_mipruner_selects(models, tmp_path):
    from lmms_eval import evaluator
    from lmms_eval.tasks import TaskManager

    from mipruner.eval.shapes import shapes_items
    from mipruner.lmms.make_tasks import write_shapes_tasks

    path, adapter = models["qwen2_5_vl"]
    tasks = tmp_path / "tasks"
    write_shapes_tasks(str(tasks), n=N_ITEMS, seed=SEED, tasks=("open",))
    worker.RECORD.clear()
    out = evaluator.simple_evaluate(model="vllm", model_args=model_args(path), tasks=["shapes_open"],
                                    batch_size=1, task_manager=TaskManager(include_path=str(tasks)),
                                    log_samples=True)
    gc.collect()
    acc = out["results"]["shapes_open"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and len(out["samples"]["shapes_open"]) == N_ITEMS
    got = [tuple(r["keep"].tolist()) for r in worker.RECORD]
    want = {}
    for item in shapes_items("shapes-open", n=N_ITEMS, seed=SEED):
        enc = mipruner.encode_for(adapter, item.media, item.question, [METHOD])
        want[item.media.tobytes()] = tuple(mipruner.select(adapter, enc, METHOD, BUDGET).keep.tolist())
    # one selection per distinct image: vLLM's multimodal cache keys an image's encoding by the image and its
    # fields, so the items asking other questions of the same image (no query here) share it
    assert {r["method"] for r in worker.RECORD} == {METHOD} and len(got) == len(want) == 2
    assert all(len(k) == BUDGET for k in got) and set(got) == set(want.values())
