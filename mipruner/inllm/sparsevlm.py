"""SparseVLM (Zhang et al., ICML 2025, "SparseVLM: Visual Token Sparsification for Efficient
Vision-Language Model Inference", arXiv 2410.04417): text raters rank the visual tokens at several
decoder layers in turn, and part of each stage's dropped tokens is recycled into merged tokens.

Original: Gumpest/SparseVLMs, branch main at its default USE_VERSION=1_0 (the v1.5 code; the
SparseVLM+ "2_0" mode is not reproduced), LLaVA path:
  llava/model/language_model/modelling_sparse_llama.py, LlamaDynamicvitModel.forward: raters,
      stages, recycling;
  llava/model/language_model/score.py, attn_postprocess_topk, layer_dict, sparse_token_dict;
  llava/model/language_model/utils.py, cluster_and_merge (DPC-kNN).
The released rule:
 1. raters, once per prompt, from the LLM's input embeddings: r = softmax over the text tokens
    after the image of V T^T (unscaled), averaged over the visual tokens; raters = text tokens with
    r above the mean of r.
 2. stages at decoder layers 2, 6, 15 of 32: the layer runs on the current sequence; its attention
    probabilities (head mean) from the raters to the visual tokens present, averaged over the
    raters, rank the visual tokens; the top c_s stay in the layer's output, so layers 3, 7, 16 are
    the first to see each pruned sequence. Released c_s at 576 tokens: "64": 66, 30, 17; "96": 238,
    48, 26; "128": 303, 110, 36; "192": 300, 200, 110. The name is the layer-averaged count of
    visual tokens, merged ones included ("64": (2*576 + 4*82 + 9*32 + 17*18) / 32 = 64.8).
 3. recycling: of a stage's dropped tokens the int(0.3 n) + 1 the raters attend to most are
    clustered on their hidden states (the layer's output) by DPC-kNN into int(n_r / 10) + 1
    clusters; each cluster's mean joins the sequence as a visual token.
Ours, with every deliberate deviation:
 - budget K = the original visual tokens surviving the last stage = `Selection.keep` (exactly K,
   indices into the N_V visual tokens). `schedule` maps (K, N_V, depth) to layers and counts: at
   N_V = 576 on 32 layers the released settings are K = 17 / 26 / 36 / 110 with exactly the
   released counts. extras["equivalent_tokens"] is the release's layer-averaged count.
 - a merged token takes the slot (sequence place and position, M-RoPE included) of its cluster's
   centre, a dropped token; the original appends merged tokens after the kept visual tokens. All
   tokens keep their original positions (FastV's semantics; SparseVLM+'s "keep position ids"),
   where v1.5 renumbers positions 0..L'-1 after each stage. So a pruned run is the model's own
   forward with the dropped tokens masked and the slots overwritten (tested).
 - merged tokens live one stage: the next stage adds them to the pool it recycles from (with its
   dropped tokens, by score) and drops them otherwise, where the release also lets them compete
   for the kept slots. So `keep` has exactly K original tokens and every layer sees as many
   visual tokens as in the release (c_s + the clusters of stage s). extras: merged_slot,
   merged_stage, merged_into (originals), merged_parent (merged tokens re-merged at the next stage).
 - a stage keeps every token when its count reaches the tokens present (the original's topk of
   min(c, n - 1) always drops one), so keep-all is the unpruned model exactly.
 - rater candidates: the tokens after the last visual token (the original has one image block);
   if none is above the mean (e.g. one text token), all candidates rate.
 - ties: stable rankings (lower index first); DPC-kNN breaks density ties by index where the
   original adds 1e-6 uniform noise; float32 scores; a merged token is the plain mean (the
   original divides by count + 1e-6). Attention probabilities come from the layer's own q_proj
   (q_norm), rotary and cached keys, causal and window masked, as for FastV (SDPA returns none).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..models.base import Answer
from ..pruners._registry import Param
from ..pruners.selection import Selection
from ._decoder import Stage
from ._probe import rater_attention  # noqa: F401  (the raters' attention, read through StageView.attention)
from ._run import answer as _staged_answer
from ._sparsevlm_schedule import (RELEASED_COUNTS, RELEASED_DEPTH, RELEASED_LAYERS, RELEASED_TOKENS,  # noqa: F401
                                  equivalent_tokens, planned_tokens, recycle_counts, schedule)
from .api import DecoderRun, Merge, prefill_logits as _staged_logits, register_inllm


def text_raters(visual: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """(N_T,) bool: the text tokens (rows of `text`) above the mean of softmax_text(V T^T) averaged
    over the visual rows; all of them when none is above (inputs: LLM input embeddings)."""
    r = (visual.float() @ text.float().T).softmax(dim=1).mean(dim=0)  # (N_V, N_T) -> (N_T,)
    raters = r > r.mean()
    return raters if bool(raters.any()) else torch.ones_like(raters)


class StagePick(NamedTuple):
    scores: torch.Tensor  # (n,) raters' mean attention of each candidate
    kept: torch.Tensor  # positions into the candidates (original tokens only), in pick order
    pool: torch.Tensor  # the others (dropped originals and every merged token), by descending score
    recycled: torch.Tensor  # the first of `pool`: those merged anew
    n_clusters: int


def rank_stage(attention: torch.Tensor, columns: torch.Tensor, merged: torch.Tensor, count: int,
               ratio: float) -> StagePick:
    """One stage: attention (R, L) of the R raters over the current sequence; columns (n,) of the
    visual tokens present, merged (n,) bool marking the previous stage's merged tokens. The top
    `count` original tokens by the raters' mean attention stay; the rest and the merged tokens
    form the pool, whose int(ratio n_pool) + 1 most attended are recycled. Ties: the lower
    position first."""
    scores = attention.mean(dim=0).index_select(0, columns)
    order = torch.sort(scores, descending=True, stable=True).indices
    is_orig = ~merged.index_select(0, order)
    count = min(count, int(is_orig.sum()))
    rank_orig = torch.cumsum(is_orig.long(), 0)  # 1-based rank of each original among the originals
    stays = is_orig & (rank_orig <= count)
    pool = order[~stays]
    n_r, n_c = recycle_counts(pool.numel(), ratio)
    return StagePick(scores, order[stays], pool, pool[:n_r], n_c)


def dpc_knn(x: torch.Tensor, n_clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DPC-kNN as in `cluster_and_merge`: (centres (M,) indices into x's rows, assign (n,) in [0, M)).

    dist = L2 / sqrt(C); density = exp(-mean of the squared distances to the n_clusters nearest,
    itself included); delta = distance to the nearest denser token (ties: the lower index is
    denser), the largest distance for the densest; centres: top n_clusters of delta * density;
    every token joins its nearest centre (the first on ties), a centre itself.
    """
    x = x.float()
    n, c = x.shape
    dist = torch.cdist(x[None], x[None], compute_mode="donot_use_mm_for_euclid_dist")[0] / c ** 0.5
    density = torch.exp(-(torch.topk(dist, n_clusters, dim=1, largest=False).values ** 2).mean(dim=1))
    idx = torch.arange(n, device=x.device)
    d_j, d_i = density[None, :], density[:, None]
    denser = (d_j > d_i) | ((d_j == d_i) & (idx[None, :] < idx[:, None]))  # [i, j]: j denser than i
    delta = torch.where(denser, dist, dist.max()).min(dim=1).values
    centres = torch.sort(delta * density, descending=True, stable=True).indices[:n_clusters]
    assign = dist.index_select(0, centres).argmin(dim=0)
    assign[centres] = torch.arange(n_clusters, device=x.device)
    return centres, assign


def _rows(prompt, alive: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Ascending sequence rows present: text, the alive visual tokens, the slots (visual indices)
    of the merged tokens present."""
    vis = prompt.visual_positions
    mask = torch.ones(prompt.length, dtype=torch.bool, device=vis.device)
    mask[vis] = False
    mask[vis[alive]] = True
    mask[vis[slots]] = True
    return torch.nonzero(mask).flatten()


def _select(run: DecoderRun, k: int, ratio: float) -> Selection:
    vis = run.visual_positions
    dev, n_v = vis.device, run.n_visual
    layers, counts = schedule(k, n_v, run.n_layers)
    after = run.text_after
    if after.numel() == 0:
        raise ValueError("SparseVLM rates the visual tokens with the prompt tokens after them: there are none")
    raters = after[text_raters(run.embeddings(vis), run.embeddings(after))]
    alive = torch.ones(n_v, dtype=torch.bool, device=dev)
    survived = torch.zeros(n_v, dtype=torch.long, device=dev)
    stage_scores = torch.full((len(layers), n_v), float("nan"), device=dev)
    merged_into = torch.full((n_v,), -1, dtype=torch.long, device=dev)
    slots, m_stage, parent = (torch.zeros(0, dtype=torch.long, device=dev) for _ in range(3))
    live = slots  # the merged tokens present (those of the previous stage), indices into `slots`
    for s, (layer, count) in enumerate(zip(layers, counts)):
        view = run.at(layer)  # the public in-LLM API (`mipruner.inllm.api`)
        att = view.attention(raters)  # (R, L_cur) the raters' head-mean attention at layer - 1
        cand = torch.nonzero(alive).flatten()  # original tokens present, ascending
        which = torch.cat([cand, slots[live]])  # visual index of every visual row present
        seq = vis[which]
        cols = view.columns(seq)
        is_m = torch.arange(which.numel(), device=dev) >= cand.numel()
        pick = rank_stage(att, cols, is_m, count, ratio)
        stage_scores[s, cand] = pick.scores[: cand.numel()]
        order = cand[pick.kept]
        survived[order] += 1
        alive[cand] = False
        alive[order] = True
        merge, new = None, slots[:0]
        if pick.recycled.numel():
            rec = pick.recycled
            centres, assign = dpc_knn(view.hidden(seq[rec]), pick.n_clusters)
            base = slots.numel()
            o = rec < cand.numel()
            merged_into[which[rec[o]]] = assign[o] + base
            parent[live[rec[~o] - cand.numel()]] = assign[~o] + base
            new = which[rec[centres]]
            slots = torch.cat([slots, new])
            m_stage = torch.cat([m_stage, torch.full_like(new, s)])
            parent = torch.cat([parent, torch.full_like(new, -1)])
            live = torch.arange(base, slots.numel(), device=dev)
            merge = Merge(vis[new], seq[rec], assign)
        else:
            live = slots[:0]
        run.keep(view, torch.nonzero(alive).flatten(), merge=merge)
    last = survived.clamp(max=len(layers) - 1)  # the last stage that ranked each token
    scores = survived.float() + stage_scores.gather(0, last[None])[0]
    per_stage = torch.bincount(m_stage, minlength=len(layers)).tolist()
    after_stage = [c + m for c, m in zip(counts, per_stage)]
    sel = Selection.from_order(order, scores)
    sel.extras.update(
        layer=layers[-1], layers=torch.tensor(layers), counts=torch.tensor(counts), survived=survived.cpu(),
        stage_scores=stage_scores.cpu(), raters=raters.cpu(), merged_slot=slots.cpu(), merged_stage=m_stage.cpu(),
        merged_into=merged_into.cpu(), merged_parent=parent.cpu(), recycle_ratio=ratio, n_merged=per_stage[-1],
        equivalent_tokens=equivalent_tokens(layers, after_stage, n_v, run.n_layers))
    return sel


def stages_of(prompt, selection: Selection) -> list[Stage]:
    """The schedule of `Stage`s a SparseVLM selection describes (its extras), for a replay."""
    ex = selection.extras
    if "merged_parent" not in ex:
        raise ValueError("not a SparseVLM selection (its extras lack the stages): select with 'sparsevlm'")
    vis = prompt.visual_positions
    dev = vis.device
    survived, slot = ex["survived"].to(dev), ex["merged_slot"].to(dev)
    m_stage, into, parent = ex["merged_stage"].to(dev), ex["merged_into"].to(dev), ex["merged_parent"].to(dev)
    stages = []
    for s, layer in enumerate(ex["layers"].tolist()):
        new = torch.nonzero(m_stage == s).flatten()  # merged tokens made at stage s: a contiguous range
        merge = (None, None, None)
        if new.numel():
            orig = torch.nonzero(torch.isin(into, new)).flatten()  # original members (visual indices)
            prev = torch.nonzero(torch.isin(parent, new)).flatten()  # merged members (of stage s - 1)
            merge = (vis[slot[new]], vis[torch.cat([orig, slot[prev]])], torch.cat([into[orig], parent[prev]]) - new[0])
        stages.append(Stage(layer, _rows(prompt, survived > s, slot[new]), *merge))
    return stages


def _check(selection: Selection) -> None:
    if "merged_parent" not in selection.extras:
        raise ValueError("not a SparseVLM selection (its extras lack the stages): select with 'sparsevlm'")


@torch.no_grad()
def answer(adapter, encoded, selection: Selection, *, max_new_tokens: int = 64, cache: dict | None = None,
           min_new_tokens: int = 0) -> Answer:
    """Greedy answer on a SparseVLM selection: its stages replayed (or the prefix `select` left in
    `cache` reused), then the remaining layers and decoding. input_tokens: the prompt rows after the
    last stage; visual_tokens: K + the last stage's merged tokens. Timings as `inllm.generate`."""
    _check(selection)
    return _staged_answer(adapter, encoded, selection, max_new_tokens=max_new_tokens, cache=cache,
                          min_new_tokens=min_new_tokens)


@torch.no_grad()
def prefill_logits(adapter, encoded, selection: Selection) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward pruned as `selection` says: one row
    per prompt row left after the last stage (text, kept and merged visual rows), in prompt order."""
    _check(selection)
    return _staged_logits(adapter, encoded, selection)


RECYCLE = Param.real("recycle_ratio", 0.3, 0.0, 1.0, "share of each stage's dropped (and last merged) tokens "
                     "recycled into merged tokens, the most attended first; 0 = none (SparseVLM: 0.3)",
                     code="rec", step=0.05)


@register_inllm("sparsevlm", params=(RECYCLE,), label="SparseVLM")
@torch.no_grad()
def sparsevlm(run: DecoderRun, budget: int, *, recycle_ratio: float = 0.3) -> Selection:
    """SparseVLM: text raters rank the visual tokens at three layers; dropped ones partly merged."""
    return _select(run, budget, float(recycle_ratio))
