"""`python -m mipruner.bench gpu` on tiny random-weight shapes (a CPU smoke run of the GPU bench):
every cell decodes the forced length, pruned rows feed the LLM N_V - K fewer tokens, ratios are
to the plain `generate` row of the same run, batched rows cover every batch size, the static path
runs, and the JSON holds every row."""
from __future__ import annotations

import json

import pytest

from mipruner.bench.__main__ import COMMANDS
from mipruner.bench.gpu import main, parse_method

BASE = ["--tiny", "--llm-layers", "2", "--repeats", "1", "--warmup", "0", "--device", "cpu", "--dtype", "fp32",
        "--budgets", "4,6"]


def test_tiny_run_both_shapes(tmp_path):
    out = tmp_path / "gpu.json"
    rows = main(BASE + ["--methods", "mi:lam=1,random,fastv", "--batches", "1,3", "--batch-methods", "mi:lam=1,fastv",
                        "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    for shape in ("llava-1.5-7b", "llava-next-7b"):
        lat = [r for r in rows if r["shape"] == shape and r["kind"] == "latency"]
        assert [(r["method"], r["budget"]) for r in lat] == [
            ("generate", "all"), ("none", "all"), ("mi:lam=1", 4), ("mi:lam=1", 6), ("random", 4), ("random", 6),
            ("fastv", 4), ("fastv", 6)]
        full = lat[0]["llm_tokens"]
        assert lat[1]["llm_tokens"] == full and lat[0]["vs_generate"] == 1.0 and lat[1]["vs_none"] == 1.0
        n_visual = lat[1]["visual_tokens"]
        for r in lat[2:]:
            assert r["llm_tokens"] == full - (n_visual - r["budget"]) and r["new_tokens"] == 2
            assert r["total_ms"] > 0 and r["vs_generate"] == pytest.approx(r["total_ms"] / lat[0]["total_ms"])
        thr = [r for r in rows if r["shape"] == shape and r["kind"] == "throughput"]
        assert sorted({(r["method"], r["batch"]) for r in thr}) == sorted(
            (m, b) for m in ("generate", "none", "mi:lam=1", "fastv") for b in (1, 3))
        for r in thr:
            assert r["items_s"] == pytest.approx(r["batch"] / r["total_ms"] * 1e3) and r["llm_items_s"] >= r["items_s"]


def test_static_cache_path_and_flags(capsys):
    rows = main(BASE + ["--shapes", "llava-1.5-7b", "--methods", "similarity", "--batches", "2",
                        "--batch-methods", "similarity", "--static-cache", "--bucket", "16"])
    assert [r["method"] for r in rows if r["kind"] == "latency"] == ["generate", "none", "similarity", "similarity"]
    assert all(r["new_tokens"] == 2 for r in rows)
    # the compile and bucket counts: nothing compiled on the static path without --compile
    assert "compiled path: 0 graphs compiled; (rows, width) buckets run per compiled function: none" in capsys.readouterr().out
    assert "gpu" in COMMANDS
    assert parse_method("mi:lam=1") == ("mi", {"lam": 1}) and parse_method("mi:lam=0.5")[1] == {"lam": 0.5}
    with pytest.raises(ValueError, match="Unknown pruner"):
        parse_method("nosuch")
    with pytest.raises(ValueError, match="unknown shape"):
        main(["--shapes", "llava-13b"])


def test_batch_cells_encode_with_one_tower_call_and_the_view_cells():
    """A batch cell of B items calls the vision tower once (`encode_items`); `--view` times one answer
    against the six answers of one view and reports their ratio."""
    from mipruner.bench.gpu import TINY, make_batch_run
    from mipruner.bench.prefill import test_image
    from mipruner.models.llava.random_weights import build_random_llava

    ad, _ = build_random_llava(llm_layers=2, dtype=__import__("torch").float32, **TINY)
    calls = []
    handle = ad.model.model.vision_tower.embeddings.register_forward_hook(lambda *a: calls.append(1))  # a pass
    try:
        ans, t = make_batch_run(ad, test_image(56), "mi", 4, 2, {"lam": 1.0}, 3)()
    finally:
        handle.remove()
    assert len(calls) == 1 and len(ans.token_ids) == 2 and ans.visual_tokens == 4
    rows = main(BASE + ["--shapes", "llava-1.5-7b", "--view", "--repeats", "1"])
    assert [(r["method"], r["batch"]) for r in rows] == [("one answer", 1), ("6 answers", 6),
                                                          ("5 answers (slider)", 5)]
    assert rows[1]["six_answers_vs_one"] == pytest.approx(rows[1]["median_ms"] / rows[0]["median_ms"], abs=1e-3)
    assert rows[2]["slider_view_vs_one"] == pytest.approx(rows[2]["median_ms"] / rows[0]["median_ms"], abs=1e-3)
