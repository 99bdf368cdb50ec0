"""bench latency's statistics, floors, goals and report format (no timing is asserted)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mipruner.bench.floors import cell_floor, device_figures, floor_ratio, kv_bytes, tower_flops, weight_bytes
from mipruner.bench.latency_report import TARGETS, format_report, goals
from mipruner.bench.stats import ci_ranks, median_ci, ratio_text

# LLaVA-1.5-7B's LLM and tower at their real sizes (configs' numbers, no weights)
TEXT = SimpleNamespace(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32,
                       intermediate_size=11008, vocab_size=32064)
VISION = SimpleNamespace(image_size=336, patch_size=14, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24)
LLAVA = SimpleNamespace(text_config=TEXT, vision_config=VISION)


def test_order_statistic_interval_matches_the_binomial_tables():
    assert ci_ranks(5) is None  # 2 / 2**5 > 0.05: no 95% interval from 5 runs
    assert ci_ranks(6)[:2] == (1, 6)
    assert ci_ranks(30)[:2] == (10, 21) and ci_ranks(30)[2] == pytest.approx(0.95723, abs=1e-5)
    assert ci_ranks(100)[:2] == (40, 61)
    for n in range(6, 60):
        j, k, cov = ci_ranks(n)
        assert cov >= 0.95 and k == n + 1 - j
        below = sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n  # one more rank inward is under 95%
        assert 1 - 2 * below < 0.95
    with pytest.raises(ValueError):
        ci_ranks(10, 1.0)


def test_median_ci_of_known_values():
    vals = [float(v) for v in range(30, 0, -1)]  # 30..1, unsorted on purpose
    m = median_ci(vals)
    assert m["median"] == 15.5 and (m["low"], m["high"]) == (10.0, 21.0) and m["n"] == 30
    few = median_ci([3.0, 1.0, 2.0])
    assert few["median"] == 2.0 and few["low"] is None and few["coverage"] is None
    assert ratio_text(m, m) == "1.000 (0.476-2.100)"
    assert ratio_text(few, m) == f"{2.0 / 15.5:.3f}"
    with pytest.raises(ValueError):
        median_ci([])


def test_device_table_and_override():
    h100 = device_figures("NVIDIA H100 80GB HBM3", "bf16")
    assert h100["peak_flops"] == 989.4e12 and h100["bandwidth"] == 3350e9 and "H100 SXM" in h100["source"]
    assert device_figures("NVIDIA H100 PCIe", "bf16")["bandwidth"] == 2000e9
    assert device_figures("NVIDIA H200", "bf16")["bandwidth"] == 4800e9
    assert device_figures("NVIDIA A100-SXM4-80GB", "bf16")["bandwidth"] == 2039e9
    assert device_figures("NVIDIA A100-SXM4-40GB", "bf16")["bandwidth"] == 1555e9
    assert device_figures("NVIDIA H100 80GB HBM3", "fp32")["peak_flops"] == 67e12
    cpu = device_figures("cpu", "fp32")
    assert cpu["peak_flops"] is None and cpu["bandwidth"] is None and "unknown" in cpu["source"]
    given = device_figures("cpu", "fp32", peak_tflops=2.0, bandwidth_gbs=50.0)
    assert given["peak_flops"] == 2e12 and given["bandwidth"] == 50e9 and "command line" in given["source"]
    assert device_figures("NVIDIA H100 80GB HBM3", "bf16", bandwidth_gbs=3000.0)["peak_flops"] == 989.4e12


def test_floors_at_the_llava_7b_shape():
    w = weight_bytes(LLAVA, "bf16")
    assert 12.9e9 < w["llm"] < 13.6e9  # 6.5-6.7 B decoder parameters + the output head, 2 bytes each
    assert kv_bytes(LLAVA, 1, "bf16") == 2 * 32 * 4096 * 2  # 0.5 MB a token
    T = 24 * 24 + 1  # patches + [CLS]
    blocks = 24 * (2 * T * (4 * 1024 ** 2 + 2 * 1024 * 4096) + 4 * T * T * 1024)
    assert 370e9 < blocks < 390e9  # CLIP ViT-L/14-336: about 190 G multiply-adds
    assert tower_flops(LLAVA) == blocks + 2 * 576 * (1024 * 4096 + 4096 * 4096)  # + the two-layer projector
    assert tower_flops(SimpleNamespace(text_config=TEXT)) == 0.0
    dev = device_figures("NVIDIA H100 80GB HBM3", "bf16")
    f = cell_floor(LLAVA, dev, "bf16", prompt=79, new_tokens=2)
    # at 79 tokens the prefill is bound by reading the weights, not by the FLOPs
    assert f["ttft_memory_ms"] > f["ttft_compute_ms"] and f["ttft_ms"] == f["ttft_memory_ms"]
    assert f["decode_weight_ms"] == pytest.approx(w["llm"] / 3350e9 * 1e3)
    assert f["decode_step_ms"] > f["decode_weight_ms"]
    big = cell_floor(LLAVA, dev, "bf16", prompt=591, new_tokens=2, rows=32)
    assert big["ttft_ms"] == big["ttft_compute_ms"]  # 32 x 591 tokens: compute-bound
    none = cell_floor(LLAVA, device_figures("cpu", "fp32"), "fp32", prompt=79, new_tokens=2)
    assert none["ttft_ms"] is None and none["decode_step_ms"] is None and none["prefill_flops"] > 0


def _m(x):
    return {"median": x, "low": x * 0.9, "high": x * 1.1, "coverage": 0.957, "n": 30}


def _cell(phase, kind, method, length=2, batch=1, total=10.0, ttft=None, per=None, floor=None, budget="all",
          **extra):
    c = {"name": method, "phase": phase, "kind": kind, "method": method, "budget": budget, "length": length,
         "batch": batch, "compiles_warmup": 1, "compiles_timed": 0, "reserved_mb": None, "prompt_tokens": 79,
         "total_ms": _m(total)}
    if ttft is not None:
        c["ttft_ms"] = _m(ttft)
    if per is not None:
        c["decode_ms_per_token"] = _m(per)
    if floor is not None:
        c["floor"] = floor
    c.update(extra)
    return c


def test_goals_are_ratios_of_the_cells():
    fl = {"ttft_ms": 5.0, "decode_step_ms": 4.5, "decode_weight_ms": 4.0}
    cells = [
        _cell("compiled", "latency", "generate-static", ttft=40.0, per=8.0, floor=fl),
        _cell("compiled", "latency", "ours-mi", ttft=10.0, per=6.0, floor=fl, budget=64),
        _cell("compiled", "latency", "ours-mi", length=32, ttft=10.0, per=5.0, floor=fl, budget=64),
        _cell("compiled", "view", "one answer", total=20.0), _cell("compiled", "view", "6 answers", batch=6, total=29.0),
        _cell("compiled", "view", "one answer", length=32, total=100.0),
        _cell("compiled", "view", "6 answers", length=32, batch=6, total=130.0),
        _cell("eager", "batch", "generate", batch=32, total=800.0),
        _cell("eager", "batch", "ours-none", batch=32, total=1000.0),
        _cell("eager", "batch", "ours-mi", batch=32, total=100.0),
        _cell("compiled", "batch", "generate-static", batch=32, total=600.0),
        _cell("compiled", "batch", "ours-none", batch=32, total=500.0),
        _cell("compiled", "batch", "ours-mi", batch=32, total=150.0),
        {"kind": "select", "method": "mi", "budget": 64, "n_visual": 576, "total_ms": _m(0.4)},
        {"kind": "select", "method": "cdpruner", "budget": 64, "n_visual": 576, "total_ms": _m(2.0)},
        _cell("eager", "encode", "encode_items", length=0, per_image_ms=_m(12.0)),
        _cell("eager", "encode", "encode_items", length=0, batch=32, per_image_ms=_m(2.0)),
    ]
    g = goals(cells)
    assert g["mi_ttft_vs_generate_static"] == 0.25 and g["mi_ttft_vs_floor"] == 2.0
    assert g["decode_vs_weight_floor"] == {"ours-mi": 1.25}  # the longest answer's cells
    assert g["six_answers_vs_one_n2"] == 1.45 and g["six_answers_vs_one_n32"] == 1.3
    # each phase's ours against that phase's generate (one interleaved group), never across phases (800 / 500
    # would compare cells that did not run interleaved); the goal is the lower phase's ratio
    assert g["batch_by_phase"]["eager"]["none"] == 0.8 and g["batch_by_phase"]["eager"]["mi"] == 8.0
    assert g["batch_by_phase"]["compiled"]["none"] == 1.2 and g["batch_by_phase"]["compiled"]["mi"] == 4.0
    assert g["batch_none_vs_generate"] == 0.8 and g["batch_mi_vs_generate"] == 4.0
    assert g["select_max_ms"] == 2.0 and g["select_over_0_5ms"] == ["cdpruner"]
    assert g["encode_ms_per_image_b1"] == 12.0 and g["encode_ms_per_image_bB"] == 2.0
    assert g["targets"] == TARGETS
    empty = goals([])
    assert all(empty[k] is None for k in TARGETS) and empty["select_over_0_5ms"] == []


def test_report_format_names_its_sources_and_intervals():
    fl = {"ttft_ms": 5.0, "decode_step_ms": 4.5, "decode_weight_ms": 4.0, "total_ms": 9.5}
    cells = [_cell("compiled", "latency", "generate-static", ttft=40.0, per=8.0, floor=fl),
             _cell("compiled", "latency", "ours-mi", ttft=10.0, per=6.0, floor=fl, budget=64)]
    report = {"device": "NVIDIA H100 80GB HBM3", "dtype": "bf16", "model": "m", "n_visual": 576, "budget": 64,
              "device_figures": device_figures("NVIDIA H100 80GB HBM3", "bf16"), "timer": "CUDA events",
              "repeats": 30, "warmup": 4, "inputs": 4, "interval": "order-statistic", "lengths": [2], "cells": cells}
    report["goals"] = goals(cells)
    text = format_report(report)
    assert "H100 SXM: NVIDIA H100 Tensor Core GPU datasheet" in text and "CUDA events" in text
    assert "10.0 [9.0-11.0]" in text  # a median and its interval
    assert "ours-mi@64" in text and "TTFT/floor" in text and "2.00" in text  # 10 ms against a 5 ms floor
    assert ("n=2 compiled: ours-mi / generate-static: total 1.000 (0.818-1.222) [floor 1.000 (ms)], "
            "TTFT 0.250 (0.205-0.306) [floor 1.000 (ms)]") in text
    assert "mi_ttft_vs_generate_static 0.25 [floor 1.000 (ms)] (target <= 0.5)" in text


def test_floor_of_a_ratio_in_ms_where_known_else_in_flops():
    dev, cpu = device_figures("NVIDIA H100 80GB HBM3", "bf16"), device_figures("cpu", "fp32")
    mi, gen = (cell_floor(LLAVA, cpu, "fp32", prompt=p, new_tokens=32) for p in (79, 591))
    r, basis = floor_ratio(mi, gen, "ttft")
    assert basis == "FLOPs" and r == round(mi["prefill_flops"] / gen["prefill_flops"], 3) and 0 < r < 1
    r, basis = floor_ratio(mi, gen, "total")
    assert basis == "FLOPs" and r == round(mi["total_flops"] / gen["total_flops"], 3)
    assert mi["total_flops"] > mi["prefill_flops"]  # 31 decoding steps after the prefill
    mi, gen = (cell_floor(LLAVA, dev, "bf16", prompt=p, new_tokens=32) for p in (79, 591))
    r, basis = floor_ratio(mi, gen, "total")
    assert basis == "ms" and r == round(mi["total_ms"] / gen["total_ms"], 3)
    assert mi["total_ms"] == pytest.approx(mi["ttft_ms"] + 31 * mi["decode_step_ms"])
    assert floor_ratio(None, gen) == (None, None)
    # rows of their own lengths (the app's view: the unpruned row and pruned ones), no tower pass
    view = cell_floor(LLAVA, cpu, "fp32", prompt=600, new_tokens=2, images=0, prompts=[600, 100, 100])
    one = cell_floor(LLAVA, cpu, "fp32", prompt=600, new_tokens=2, images=0)
    assert view["prefill_flops"] == one["prefill_flops"] + 2 * cell_floor(LLAVA, cpu, "fp32", 100, 2, images=0)[
        "prefill_flops"]


class MarkClock:
    """Marks 0, 1, 2, ... in call order: each part's time is the count of marks between its ends."""

    cuda = False

    def __init__(self):
        self.n = -1

    def mark(self):
        self.n += 1
        return float(self.n)

    def ms(self, a, b):
        return b - a

    def sync(self):
        pass


@pytest.fixture(scope="module")
def tiny_llava():
    import torch

    from mipruner.bench.zoo import get_family

    adapter, _ = get_family("llava").build(tiny=True, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    return adapter


def test_run_parts_are_timed_between_their_own_marks(tiny_llava):
    """select_ms is encoded -> selected, not start -> selected (which held the encode): marks start 0,
    encoded 1, selected 2, first logits 3, end 4."""
    from mipruner.bench import latency
    from mipruner.bench import latency_runs as R

    image, prompt = latency.inputs(1, int(tiny_llava.config.vision_config.image_size))[0]
    r = R.ours(tiny_llava, MarkClock(), 3, "mi", 8, {"lam": 1.0})(image, prompt)
    assert (r["encode_ms"], r["select_ms"], r["ttft_ms"], r["total_ms"]) == (1.0, 1.0, 3.0, 4.0)
    r = R.batch(tiny_llava, MarkClock(), 3, "mi", 8, {"lam": 1.0}, 2)(image, prompt)
    assert (r["encode_ms"], r["select_ms"], r["total_ms"]) == (1.0, 1.0, 4.0)


def test_selection_cells_time_the_end_to_end_mi(tiny_llava):
    """The select cell of MI runs MI as the MI@budget cells do (lambda 1, not "auto"), and says so."""
    from mipruner.bench import latency

    pairs = latency.inputs(1, int(tiny_llava.config.vision_config.image_size))
    cells = {c["method"]: c for c in latency.select_cells(tiny_llava, MarkClock(), pairs, 8, 1)}
    assert cells["mi"]["params"] == dict(latency.MI[1]) == {"lam": 1.0} and cells["mi"]["label"] == "mi lam=1"
    assert cells["random"]["params"] == {} and cells["random"]["label"] == "random"


def test_the_compiled_phase_pads_only_where_something_compiles():
    import torch

    from mipruner.bench.latency import compiled_path

    assert compiled_path(torch.device("cpu")) == {"bucket": 0, "static_cache": True, "compile": True}
    assert compiled_path(torch.device("cuda"))["bucket"] == 64


def test_a_tiny_run_writes_every_cell(tmp_path, capsys):
    import json

    from mipruner.bench import latency

    path = tmp_path / "latency.json"
    assert latency.main(["--tiny", "--device", "cpu", "--lengths", "2,3", "--view-lengths", "2", "--repeats", "2",
                         "--warmup", "1", "--inputs", "2", "--batch", "2", "--no-select", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    cells = report["cells"]
    got = {(c["phase"], c["kind"], c["method"], c["length"], c["batch"]) for c in cells if c["kind"] != "select"}
    for phase, gen in (("eager", "generate"), ("compiled", "generate-static")):
        for n in (2, 3):
            assert {(phase, "latency", m, n, 1) for m in (gen, "ours-none", "ours-mi")} <= got
        assert {(phase, "batch", m, 2, 2) for m in (gen, "ours-none", "ours-mi")} <= got
    assert ("compiled", "view", "one answer", 2, 1) in got and ("compiled", "view", "6 answers", 2, 6) in got
    assert {("eager", "encode", "encode_items", 0, b) for b in (1, 2)} <= got
    for c in cells:
        if c["kind"] in ("latency", "batch"):
            assert c["new_tokens"] == [c["length"]] and c["total_ms"]["n"] == 2
            assert c["ttft_ms"]["median"] <= c["total_ms"]["median"] and c["decode_ms_per_token"]["n"] == 2
            assert c["floor"]["ttft_ms"] is None and c["floor"]["prefill_flops"] > 0  # the CPU: floor unknown
            assert c["compiles_timed"] >= 0 and c["reserved_mb"] is None
    assert not [c for c in cells if c["kind"] == "select"]  # --no-select
    assert report["device_figures"]["source"].startswith("unknown on the CPU")
    assert report["compiled_path"]["bucket"] == 0  # the CPU: nothing compiles, nothing padded
    for c in cells:
        if c["kind"] in ("latency", "batch", "view"):
            assert c["floor"]["total_flops"] >= c["floor"]["prefill_flops"] > 0
    for phase in ("eager", "compiled"):  # the prompt is the same with and without the static path: no padding
        a, b = (next(c for c in cells if (c["phase"], c["method"], c["length"]) == (phase, m, 2))
                for m in ("ours-none", "ours-mi"))
        assert a["prompt_tokens"] > b["prompt_tokens"]
    assert {c["prompt_tokens"] for c in cells if c["method"] == "ours-none" and c["kind"] == "latency"} == {
        next(c for c in cells if c["method"] == "ours-none")["prompt_tokens"]}
    view = next(c for c in cells if c["kind"] == "view" and c["batch"] > 1)
    assert len(view["row_tokens"]) == view["batch"] and view["row_tokens"][0] == view["prompt_tokens"]
    assert report["goals"]["floors"]["six_answers_vs_one_n2"]["basis"] == "FLOPs"
    assert set(TARGETS) <= set(report["goals"])
    out = capsys.readouterr().out
    assert "device figures: unknown on the CPU" in out and "goals: mi_ttft_vs_generate_static" in out
