"""The compute every selection reports (`mipruner.measure.compute`, written out in docs/methods.md "Compute"):
a pre-LLM method at K and keep-all equal the FLOPs formula restated here from the model's config;
an in-LLM method counts its layers stage by stage; a withdraw-everything stage leaves no visual row;
eval's --equal-compute picks, per method, the budget closest to the target share. Integers exactly."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import mipruner
from mipruner.measure.compute import LLMShape, compute_of
from mipruner.eval.runner import closest_compute, evaluate, flops_share, format_rows, same_compute
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
    # the printed table: each method's line names the budget taken and its FLOPs share, cell by cell
    lines = cells(format_rows(rows))
    assert lines[0] == ["method", "budget", "split", "acc", "f1", "yes_rate", "query_recall", "kept", "flops", "n"]
    for r in rows:
        line = next(c for c in lines[2:] if c[0] == r["method"])
        want = "all" if r["method"] == "none" else f"~50% FLOPs (K={r['chosen']})"
        assert line[1] == want and line[8] == f"{100 * r['flops']:.1f}%" and line[9] == str(r["n"]), line
        assert line[7] == f"{r['kept']:.1f}"
    assert next(c for c in lines[2:] if c[0] == "none")[8] == "100.0%"


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
    at = cells(res.table_at_compute(0.4))
    assert at[0] == ["method", "budget (at ~40% FLOPs)", "acc", "f1", "yes_rate", "query_recall", "kept", "flops", "n"]
    every = cells(res.table())
    assert every[0][-2:] == ["flops", "n"] and len(every) == 2 + 1 + 2 * 3
    for m in ("mi", "fastv"):
        pts = res.points(m)
        best = min(pts, key=lambda p: abs(p["flops"] - 0.4))
        assert next(c for c in at[2:] if c[0] == m)[1:2] + next(c for c in at[2:] if c[0] == m)[-2:-1] == \
            [str(best["value"]), f"{best['flops']:.3f}"]
        assert [(c[1], c[-2]) for c in every[2:] if c[0] == m] == [(str(p["value"]), f"{p['flops']:.3f}") for p in pts]


def cells(text: str) -> list[list[str]]:
    """A printed text table's lines split into cells (columns are two or more spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]


def _withdraw_at_1(run, budget):
    """Every visual token withdrawn from layer 1 on (VTW's rule): the same compute at any budget."""
    view = run.at(1)
    run.keep(view, [])
    scores = torch.zeros(run.n_visual, device=run.visual_positions.device)
    return mipruner.Selection.from_order(torch.zeros(0, dtype=torch.long, device=scores.device), scores)


def test_closest_compute_and_the_budgets_of_the_same_compute():
    sel = lambda share: SimpleNamespace(extras={"compute": SimpleNamespace(flops_share=share)})  # noqa: E731
    tried = [(8, sel(0.2), None), (16, sel(0.2), None), (32, None, "failed"), (64, sel(0.2), None), (128, sel(0.6), None)]
    pick = closest_compute(tried, 0.3)
    assert pick[0] == 8 and same_compute(tried, pick) == [16, 64]  # the first taken, the others named
    pick = closest_compute(tried, 0.5)
    assert pick[0] == 128 and same_compute(tried, pick) == []
    assert same_compute(tried, tried[2]) == []


def test_equal_compute_names_every_budget_of_the_same_compute(model, tmp_path):
    """A method that withdraws every visual token at layer 1 costs the same at every K: eval's table names
    the budget answered and every other of the same FLOPs, and the sweep's equal-compute table too."""
    from mipruner.eval.shapes import shapes_items
    from mipruner.eval.sweep import Sweep, run_sweep
    from mipruner.inllm import register_inllm

    from .plugin_registry import registry_restored

    ad, _ = model
    items = shapes_items("shapes-open", n=1)
    with registry_restored(tmp_path):
        register_inllm("withdraw_at_1_test", label="withdraw at 1")(_withdraw_at_1)
        rows = evaluate(ad, items, ["none", "withdraw_at_1_test", "mi"], [8, 16, 64], {}, "t", max_new_tokens=2,
                        equal_compute=0.3)
        res = run_sweep(ad, items, Sweep(methods=("withdraw_at_1_test", "mi"), param="budget", values=(8, 16, 64),
                                         max_new_tokens=2))
    w = next(r for r in rows if r["method"] == "withdraw_at_1_test")
    mi = next(r for r in rows if r["method"] == "mi")
    assert (w["chosen"], w["same_flops"]) == ("8", "16,64") and mi["same_flops"] == ""
    lines = cells(format_rows(rows))
    assert next(c for c in lines if c[0] == "withdraw_at_1_test")[1] == "~30% FLOPs (K=8; same FLOPs at K=16,64)"
    assert next(c for c in lines if c[0] == "mi")[1] == f"~30% FLOPs (K={mi['chosen']})"
    at = {r["method"]: r for r in res.at_compute(0.3)}
    assert at["withdraw_at_1_test"]["value"] == 8 and at["withdraw_at_1_test"]["same_flops"] == [16, 64]
    assert at["mi"]["same_flops"] == []
    table = cells(res.table_at_compute(0.3))
    assert next(c for c in table if c[0] == "withdraw_at_1_test")[1] == "8 (same FLOPs at 16,64)"
    assert next(c for c in table if c[0] == "mi")[1] == str(at["mi"]["value"])


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
