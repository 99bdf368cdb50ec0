"""`python -m mipruner.bench efficiency` on a tiny LLaVA: cells, forced answer length, memory probe."""
from __future__ import annotations

import math
import os

import pytest
import torch

import mipruner
from mipruner.bench.efficiency import PeakMemory, format_rows, main, run_all

from ..models.tiny_llava import save_tiny


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("eff") / "llava")), device="cpu")


def test_cells_lengths_and_ratios(adapter):
    rows = run_all(adapter, ["none", "random", "fastv", "dart"], [4], repeats=2, warmup=0, new_tokens=5,
                   params={"layer": 1}, log=lambda *_: None)
    assert [(r["method"], r["budget"]) for r in rows] == [("none", "all"), ("none-loop", "all"), ("random", 4),
                                                         ("fastv", 4), ("dart", 4)]
    full = rows[0]["llm_tokens"]
    for r in rows:
        assert r["new_tokens"] == 5 and r["repeats"] == 2  # EOS masked: every method decodes 5 tokens
        assert r["total_ms"] >= r["encode_ms"] + r["prefill_ms"] + r["decode_ms"]
        assert r["llm_tokens"] == (full if r["budget"] == "all" else full - (16 - 4))
    assert rows[0]["ratio"] == 1.0
    assert "fastv" in format_rows(rows)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_memory_sees_an_allocation():
    mem = PeakMemory(torch.device("cpu"))
    mem.start()
    x = torch.ones(16, 2 ** 20)  # 64 MiB, touched
    del x
    peak = mem.stop()
    assert not math.isnan(peak) and 60 * 2 ** 20 <= peak < 200 * 2 ** 20


def test_unknown_method_fails_before_building_a_model():
    with pytest.raises(ValueError, match="Unknown pruner"):
        main(["--methods", "none,nosuch", "--model", "nowhere"])
