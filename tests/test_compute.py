"""The compute every selection reports (`mipruner.compute`, written out in docs/methods.md "Compute"):
a pre-LLM method at K and keep-all equal the FLOPs formula restated here from the model's config;
an in-LLM method counts its layers stage by stage; a withdraw-everything stage leaves no visual row;
eval's --equal-compute picks, per method, the budget closest to the target share. Integers exactly."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.compute import LLMShape, compute_of
from mipruner.eval.runner import closest_compute, evaluate, flops_share, format_rows
from mipruner.inllm._prompt import prompt_of
from mipruner.testing import embedded_encoding
from tests.no_grad import no_grad  # noqa: F401


@pytest.fixture(scope="module")
def model():
    return embedded_encoding()


def _doc_formula(cfg, n_layers, vocab, rows):
    """docs/methods.md: sum_l [4 n d H d_h + 4 n d KV d_h + 4 n^2 H d_h + 6 n d I] + 2 d V."""
    d, i, h, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    dh = getattr(cfg, "head_dim", None) or d // h
    assert len(rows) == n_layers
    return sum(4 * n * d * h * dh + 4 * n * d * kv * dh + 4 * n * n * h * dh + 6 * n * d * i for n in rows) + 2 * d * vocab


def test_pre_llm_and_keep_all_equal_the_documented_formula(model):
    ad, enc = model
    lm = ad.text_decoder()
    n_layers, vocab = len(lm.layers), ad.output_head().weight.shape[0]
    n_text = prompt_of(ad, enc).length - enc.n_visual  # the prompt's rows that are not visual
    assert n_text == enc.text.shape[0]
    full = _doc_formula(lm.config, n_layers, vocab, [n_text + enc.n_visual] * n_layers)
    for k in (1, 16, enc.n_visual):
        c = mipruner.select(ad, enc, "mi", k).extras["compute"]
        want = _doc_formula(lm.config, n_layers, vocab, [n_text + k] * n_layers)
        assert c.flops == want and c.flops_share == want / full
        assert c.visual_token_layers == k * n_layers and c.visual_rows == (k,) * n_layers
        kv_bytes = 2 * lm.config.num_key_value_heads * (lm.config.hidden_size // lm.config.num_attention_heads) * 4
        assert c.kv_bytes == n_layers * (n_text + k) * kv_bytes  # float32 model: 4 bytes a value
    assert mipruner.select(ad, enc, "mi", enc.n_visual).extras["compute"].flops_share == 1.0


def test_in_llm_counts_stage_by_stage(model):
    ad, enc = model
    lm = ad.text_decoder()
    n_layers, vocab, n_text = len(lm.layers), ad.output_head().weight.shape[0], enc.text.shape[0]
    c = mipruner.select(ad, enc, "fastv", 16, layer=2).extras["compute"]
    rows = [n_text + enc.n_visual] * 2 + [n_text + 16] * (n_layers - 2)
    assert c.flops == _doc_formula(lm.config, n_layers, vocab, rows)
    assert c.visual_rows == (enc.n_visual, enc.n_visual, 16)
    sv = mipruner.select(ad, enc, "sparsevlm", 16).extras["compute"]
    assert sv.visual_rows[0] == enc.n_visual and sv.visual_rows[-1] >= 16  # merged tokens counted
    shape = LLMShape.from_config(lm.config, layers=n_layers, vocab=vocab)
    none = compute_of(shape, n_text, enc.n_visual, None)
    assert none.flops_share == none.kv_share == none.visual_token_layers_share == 1.0


def test_equal_compute_picks_the_closest_budget(model):
    ad, enc = model
    tried = [(b, mipruner.select(ad, enc, "mi", b), None) for b in (8, 64, 128)]
    shares = {b: flops_share(s) for b, s, _ in tried}
    target = (shares[64] + shares[128]) / 2 + 0.01  # nearer 128's
    assert closest_compute(tried, target)[0] == 128
    assert closest_compute(tried, shares[8])[0] == 8
    from mipruner.eval.shapes import shapes_items

    items = shapes_items("shapes-open", n=1)
    rows = evaluate(ad, items, ["none", "mi", "fastv"], [8, 64, 128], {}, "t", max_new_tokens=2,
                    equal_compute=0.5)
    every = evaluate(ad, items, ["mi", "fastv"], [8, 64, 128], {}, "t", max_new_tokens=2)
    for m in ("mi", "fastv"):
        row = next(r for r in rows if r["method"] == m)
        cands = [r for r in every if r["method"] == m]
        best = min(cands, key=lambda r: abs(r["flops"] - 0.5))
        assert row["budget"] == "~50% FLOPs" and row["chosen"] == str(best["budget"]) and row["flops"] == best["flops"]
    assert "(K=" in format_rows(rows) and "flops" in format_rows(rows)


def test_sweeps_report_flops_and_pick_at_equal_compute(model):
    from mipruner.eval.shapes import shapes_items
    from mipruner.eval.sweep import Sweep, run_sweep

    ad, _ = model
    res = run_sweep(ad, shapes_items("shapes-open", n=1), Sweep(methods=("mi", "fastv"), param="budget",
                                                                 values=(8, 64, 128), max_new_tokens=2))
    ref = res.reference()
    assert ref["flops"] == 1.0
    for m in ("mi", "fastv"):
        pts = res.points(m)
        assert [p["value"] for p in pts] == [8, 64, 128] and all(0 < p["flops"] < 1 for p in pts)
        assert pts[0]["flops"] < pts[1]["flops"] < pts[2]["flops"]  # more tokens, more compute
        best = min(pts, key=lambda p: abs(p["flops"] - 0.4))
        assert next(r for r in res.at_compute(0.4) if r["method"] == m)["value"] == best["value"]
    assert "flops" in res.table() and "at ~40% FLOPs" in res.table_at_compute(0.4)


def test_a_random_model_at_576_tokens_with_the_default_dtype():
    from PIL import Image

    from mipruner.models import FAMILIES

    ad, desc = FAMILIES["llava"].build(tiny=True, image_size=336, llm_layers=4)  # dtype None: float32 (tiny)
    assert next(ad.model.parameters()).dtype == torch.float32 and "336px" in desc
    enc = ad.encode(Image.new("RGB", (500, 400), (200, 30, 30)), "what is in the image ?")
    assert enc.n_visual == 576  # (336 / 14)^2
    c = mipruner.select(ad, enc, "fastv", 64, layer=2).extras["compute"]
    assert c.visual_rows == (576, 576, 64, 64)
    with pytest.raises(ValueError, match="takes no image_size; those that do: llava, llava_next"):
        FAMILIES["qwen2_vl"].build(tiny=True, image_size=336)
