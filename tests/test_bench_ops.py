"""`python -m mipruner.bench ops`: the op counter counts top-level aten ops only, and a small run
reports every method (MI at both lambdas) with a positive count; no timing is asserted."""
from __future__ import annotations

import torch

from mipruner.bench import ops


def test_top_level_ops_counts_what_is_called_directly():
    x = torch.ones(8)
    assert ops.top_level_ops(lambda: x.add(1).mul(2)) == 2
    # a composite op (linear calls matmul / addmm inside) counts once
    w = torch.ones(4, 8)
    assert ops.top_level_ops(lambda: torch.nn.functional.linear(x, w)) == 1


def test_a_small_run_reports_every_method():
    lines = []
    rows = ops.run(24, 8, 3, 4, ["mi", "divprune", "visionzip", "random"], repeats=1, log=lines.append)
    assert [r["method"] for r in rows] == ["mi lam=1", "mi lam=0.5", "divprune", "visionzip", "random"]
    assert all(r["ops"] > 0 and r["eager_ms"] > 0 and r["captured_ms"] is None for r in rows)  # CPU: not captured
    by = {r["method"]: r["ops"] for r in rows}
    assert by["mi lam=0.5"] > by["mi lam=1"]  # the greedy's steps
    assert "aten ops" in lines[-1]


def test_batch_columns_time_one_by_one_against_prune_batch():
    lines = []
    rows = ops.run(24, 8, 3, 4, ["mi", "cdpruner", "random"], repeats=1, log=lines.append, batch=3)
    by = {r["method"]: r for r in rows}
    for label in ("mi lam=1", "mi lam=0.5", "random"):
        assert by[label]["batch"] == 3 and by[label]["batched_same_tokens"] is True
        assert by[label]["batched_ms_per_item"] > 0 and by[label]["one_by_one_ms_per_item"] > 0
    assert "batch" not in by["cdpruner"]  # declares no batched call
    assert "3 batched ms/item" in lines[-1]


def test_every_pre_llm_method_traces_as_one_graph_in_the_captured_column():
    """`--cpu-backend eager`: each image method's `mipruner.prune` call compiled with fullgraph=True (a graph
    break raises), pool included, more labels than dynamo's default recompile limit, MI's lambda 1 then 0.5 on one
    code object; every compiled call keeps the eager tokens."""
    import mipruner

    torch._dynamo.reset()
    methods = mipruner.list_pruners("projector") + mipruner.list_pruners("vision")
    rows = ops.run(36, 8, 3, 4, methods, repeats=1, cpu_backend="eager", log=lambda _: None)
    assert len(rows) == len(methods) + 1 > 8 and "pool" in {r["method"] for r in rows}
    video = {m for m in methods if mipruner.get_pruner(m).video}
    assert video == {"evs", "vidcom2", "fastvid"} & set(mipruner.list_pruners())
    image = [r for r in rows if r["method"].split()[0] not in video]
    assert len(image) > 8 and all(r["captured_ms"] is not None and r["same_tokens"] is True for r in image), rows
    # the video methods' frame table is host work (static in a CUDA graph): not compiled, not timed
    assert all(r["captured_ms"] is None and r["same_tokens"] is None for r in rows if r["method"] in video)
