"""The public in-LLM API (`mipruner.inllm.register_inllm`, `DecoderRun`, `StageView`, `Merge`) as a
plug-in author uses it, on the embedded model (3 decoder layers):

  a method     written in a few lines (two stages, the last prompt token's attention, renumbered
               positions) selects, answers (keep-all = the unpruned answer) and passes the checker;
  adaptive     an in-LLM method may keep fewer than the budget when it declares adaptive=True,
               and is refused (ContractError) when it does not;
  misuse       keep before at, a token not present, a selection that is not its last stage's;
  checker      a broken in-LLM answer (wrong tokens) is caught by `check_pruner`; a pre-LLM plug-in
               returning merged rows and a `prefix` row passes it (as it passes prune/select).
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner import Param, Selection
from mipruner.inllm import DecoderRun, Merge, register_inllm
from mipruner.pruners._registry import ContractError
from mipruner.testing import check_pruner


def _as_plugin(name):
    """Mark `name` as a plug-in's (the run-time contract applies to plug-ins)."""
    import dataclasses

    from mipruner.pruners import METHODS

    METHODS.replace(name, dataclasses.replace(METHODS.get(name), origin="test"))


def test_a_two_stage_method_in_a_few_lines(model, registered):
    ad, enc = model

    @register_inllm("halves", label="Halves", positions="renumber",
                    params=(Param.integer("halves_first", 1, 1, None, "first stage's layer"),))
    def halves(run: DecoderRun, budget: int, *, halves_first: int = 1) -> Selection:
        keep = torch.arange(run.n_visual, device=run.visual_positions.device)
        scores = torch.zeros(run.n_visual, device=keep.device)
        for layer, count in ((halves_first, max(budget, run.n_visual // 2)), (halves_first + 1, budget)):
            view = run.at(layer)
            row = view.attention("last")[0].index_select(0, view.columns(run.visual_positions[view.visual]))
            keep = view.visual[torch.sort(row, descending=True, stable=True).indices[:count]]
            scores[view.visual] = row
            run.keep(view, keep)
        return Selection.from_order(keep, scores)

    registered.append("halves")
    c: dict = {}
    sel = mipruner.select(ad, enc, "halves", 8, cache=c)
    assert sel.budget == 8 and [s.layer for s in sel.extras["stages"]] == [1, 2]
    assert all(s.renumber for s in sel.extras["stages"])
    # the records as docs/plugins.md states them: .layer, and .rows the ascending sequence positions present
    # from that layer on (the text's and the visual tokens kept); extras["layer"] the last stage's
    from mipruner.inllm._prompt import prompt_of

    p = prompt_of(ad, enc)
    vis, n_text = p.visual_positions.cpu(), p.length - enc.n_visual
    st = sel.extras["stages"]
    assert [int(s.rows.numel()) for s in st] == [n_text + max(8, enc.n_visual // 2), n_text + 8]
    assert all(s.rows.dtype == torch.long and bool((s.rows[1:] > s.rows[:-1]).all()) for s in st)
    assert sorted(set(st[-1].rows.tolist()) & set(vis.tolist())) == sorted(vis[sel.keep.cpu()].tolist())
    assert sel.extras["layer"] == 2
    full = mipruner.select(ad, enc, "halves", enc.n_visual, cache=c)
    assert mipruner.answer(ad, enc, full, max_new_tokens=4, cache=c).token_ids == \
        ad.generate(enc, max_new_tokens=4).token_ids
    assert mipruner.answer(ad, enc, sel, max_new_tokens=4).visual_tokens == 8
    assert check_pruner("halves", adapter=ad, encoded=enc) == []


def test_adaptive_in_llm_and_the_contract(model, registered):
    ad, enc = model

    def half_of(run, budget):
        view = run.at(1)
        keep = view.visual[: max(1, budget // 2)]
        run.keep(view, keep)
        return Selection.from_order(keep, torch.zeros(run.n_visual, device=keep.device))

    register_inllm("half_adaptive", adaptive=True)(half_of)
    register_inllm("half_fixed")(half_of)
    registered += ["half_adaptive", "half_fixed"]
    for name in registered:
        _as_plugin(name)
    assert mipruner.select(ad, enc, "half_adaptive", 10).budget == 5
    with pytest.raises(ContractError, match="half_fixed") as e:
        mipruner.select(ad, enc, "half_fixed", 10)
    assert "a fixed-K method keeps exactly K = 10 tokens, or none when a stage withdraws every visual token" \
        in str(e.value)  # the rule that applies, in the sentence

    def more_than(run, budget):
        view = run.at(1)
        keep = view.visual[: budget + 1]
        run.keep(view, keep)
        return Selection.from_order(keep, torch.zeros(run.n_visual, device=keep.device))

    register_inllm("more_adaptive", adaptive=True)(more_than)
    registered.append("more_adaptive")
    _as_plugin("more_adaptive")
    with pytest.raises(ContractError, match="expected 1 to 10: an adaptive method keeps between 1 and K = 10"):
        mipruner.select(ad, enc, "more_adaptive", 10)
    assert check_pruner("half_adaptive", adapter=ad, encoded=enc) == []
    assert any("keep has shape" in f for f in check_pruner("half_fixed", adapter=ad, encoded=enc))


def test_misuse_is_one_sentence(model, registered):
    ad, enc = model

    @register_inllm("no_keep")
    def no_keep(run, budget):
        run.at(1)
        run.at(2)

    @register_inllm("absent")
    def absent(run, budget):
        view = run.at(1)
        run.keep(view, view.visual[:2])
        view = run.at(2)
        run.keep(view, view.visual.new_tensor([5]) + 100)

    @register_inllm("liar")
    def liar(run, budget):
        view = run.at(1)
        run.keep(view, view.visual[:budget])
        return Selection.from_order(view.visual[1:budget + 1], torch.zeros(run.n_visual))

    @register_inllm("merger")
    def merger(run, budget):
        view = run.at(1)
        vis = run.visual_positions
        run.keep(view, view.visual[:budget], merge=Merge(vis[budget:budget + 1], vis[budget:], torch.zeros_like(vis[budget:])))
        return Selection.from_order(view.visual[:budget], torch.zeros(run.n_visual))

    @register_inllm("descending")
    def descending(run, budget):
        view = run.at(2)
        run.keep(view, view.visual[:budget])
        view = run.at(1)

    registered += ["no_keep", "absent", "liar", "merger", "descending"]
    with pytest.raises(ValueError, match=r"stages must ascend: run.at\(1\) comes after the stage at layer 2; "
                                         r"the next stage's layer must be in \[3, 3\]"):
        mipruner.select(ad, enc, "descending", 4)
    with pytest.raises(ValueError, match="call run.keep"):
        mipruner.select(ad, enc, "no_keep", 4)
    with pytest.raises(ValueError, match="not present"):
        mipruner.select(ad, enc, "absent", 4)
    with pytest.raises(ValueError, match="not the visual tokens its last stage keeps"):
        mipruner.select(ad, enc, "liar", 4)
    sel = mipruner.select(ad, enc, "merger", 4)  # one merged row in the first dropped slot, kept to the end
    ans = mipruner.answer(ad, enc, sel, max_new_tokens=3)
    assert ans.visual_tokens == 5 and sel.budget == 4


def test_checker_catches_a_broken_in_llm_answer(model, registered):
    from mipruner import register_pruner
    from mipruner.models.base import Answer

    ad, enc = model
    fastv = mipruner.get_pruner("fastv")

    def wrong(adapter, encoded, selection, *, max_new_tokens=64, cache=None, **kw):
        return Answer(text="", token_ids=[0], input_tokens=1, visual_tokens=selection.budget, prefill_s=0.0,
                      decode_s=0.0)

    register_pruner("fastv_wrong", stage="llm", needs=("adapter",), params=fastv.params, answer=wrong)(fastv.fn)
    registered.append("fastv_wrong")
    fails = check_pruner("fastv_wrong", adapter=ad, encoded=enc)
    assert any("keeping every token does not give the unpruned answer" in f for f in fails)


def test_prefix_and_merged_rows_pass_the_checker(registered):
    from mipruner import register_pruner

    @register_pruner("first_merged", label="first + mean")
    def first_merged(visual, text, budget):
        n = visual.shape[0]
        merge = 1 < budget < n  # keep-all keeps every token (the anchor); else K - 1 rows and one prefix row
        keep = torch.arange(budget - 1 if merge else budget, device=visual.device)
        prefix = visual.mean(dim=0, keepdim=True) if merge else None
        return Selection.from_order(keep, torch.zeros(n, device=visual.device), tokens=visual[keep] * 2, prefix=prefix)

    registered.append("first_merged")
    assert check_pruner("first_merged") == []
