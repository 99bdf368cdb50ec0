"""mipruner.serve.answer_time: the prefill FLOPs of a row, and the shares of a batched call's answers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mipruner.serve.answer_time import own_timing, row_prefill_flops, split_batch, timing_line
from mipruner.models.base import Answer

# a Llama-like text config: 2 layers, d 8, 2 heads of 4 (1 kv head), MLP 16, vocabulary 10
TEXT = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                       intermediate_size=16, vocab_size=10)


def test_row_flops_are_the_compute_formula():
    cfg = SimpleNamespace(text_config=TEXT)
    L = 5  # d 8, I 16, H 2, KV 1, d_h 4, V 10 (docs/methods.md, "Compute")
    per_layer = 4 * L * 8 * 2 * 4 + 4 * L * 8 * 1 * 4 + 4 * L * L * 2 * 4 + 6 * L * 8 * 16
    assert row_prefill_flops(cfg, L) == row_prefill_flops(TEXT, L) == 2 * per_layer + 2 * 8 * 10
    assert row_prefill_flops(TEXT, 0) == 0
    with pytest.raises(ValueError):
        row_prefill_flops(TEXT, -1)


def test_split_and_labels():
    adapter = SimpleNamespace(config=SimpleNamespace(text_config=TEXT))
    rows = [Answer("", [1], n, 0, 0.06, 0.02) for n in (40, 10)]
    split_batch(adapter, rows)
    assert sum(a.prefill_share for a in rows) == pytest.approx(1.0)
    # by compute, the formula restated (attention grows with L^2; the head's 2 d V once per row), not by
    # token count: 40 and 10 tokens are 0.868 and 0.132 of the compute, not 0.8 and 0.2
    f = [2 * (1152 * n + 32 * n * n) + 2 * 8 * 10 for n in (40, 10)]
    assert f == [194720, 29600]
    assert [a.prefill_share for a in rows] == pytest.approx([f[0] / sum(f), f[1] / sum(f)], rel=1e-12)
    assert rows[0].prefill_share == pytest.approx(0.868, abs=1e-3)
    shown = own_timing(rows[1])
    assert shown["prefill_ms"] == pytest.approx(60 * rows[1].prefill_share)
    assert timing_line(shown) == (f"prefill {shown['prefill_ms']:.0f} ms (share of a 2-answer batch's prefill, "
                                  "by compute) · decode 20 ms (the 2 answers decode together)")
    one = [Answer("", [1], 40, 0, 0.06, 0.02)]
    assert split_batch(adapter, one)[0].batch_rows == 1
    assert timing_line(own_timing(one[0])) == "prefill 60 ms · decode 20 ms"
