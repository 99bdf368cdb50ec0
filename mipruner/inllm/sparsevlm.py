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

import dataclasses
import sys
from typing import NamedTuple

import torch

from ..models.base import Answer
from ..pruners._registry import Param, register_pruner
from ..pruners.selection import Selection
from ._decoder import Stage, advance, apply_stage, continue_prefix, logits_of, prefill_cache, run_staged, start
from ._run import Started, _get_prompt, timed_greedy
from ._sparsevlm_schedule import (RELEASED_COUNTS, RELEASED_DEPTH, RELEASED_LAYERS, RELEASED_TOKENS,  # noqa: F401
                                  equivalent_tokens, planned_tokens, recycle_counts, schedule)

_LAST = "sparsevlm_prefix"  # the latest selection's staged prefix (one, so budgets do not pile up KV)


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


def rater_attention(attn, query_input: torch.Tensor, cos_sin, keys: torch.Tensor, query_index: torch.Tensor,
                    window: int | None = None) -> torch.Tensor:
    """Head-mean attention probabilities (R, L) float32 of R queries over the L cached keys.

    query_input (1, R, d): the layer's attention input at those rows; cos_sin: their rotary cos/sin;
    keys (1, KV, L, d_head); query_index (R,): each query's place among the keys (causal mask);
    window: the layer's sliding window or None.
    """
    rope = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if rope is None:
        raise NotImplementedError(f"{type(attn).__name__}: no apply_rotary_pos_emb in its module")
    d_head, r = keys.shape[-1], query_input.shape[1]
    q = attn.q_proj(query_input).view(1, r, -1, d_head)
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
    q, _ = rope(q.transpose(1, 2), q.transpose(1, 2), *cos_sin)  # (1, H, R, d_head)
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    q = q[0].float().view(n_kv, -1, r, d_head)  # grouped-query attention: head h reads KV head h // G
    logits = q @ keys[0].float().transpose(1, 2)[:, None] * float(attn.scaling)  # (KV, G, R, L)
    j = torch.arange(n_keys, device=keys.device)[None, :]
    qi = query_index.to(keys.device)[:, None]
    hidden = j > qi
    if window is not None:
        hidden = hidden | (j <= qi - window)
    return logits.masked_fill(hidden, -float("inf")).softmax(dim=-1).mean(dim=(0, 1))


def _attention(prompt, prefix) -> torch.Tensor:
    p = prefix.probe
    attn = prompt.lm.layers[prefix.layer - 1].self_attn
    return rater_attention(attn, p["query_input"], p["cos_sin"], p["keys"], p["query_index"], p["window"])


def _first(prompt, layer: int, cache: dict | None):
    """(prefix at the first stage's layer with its KV, raters' attention there, rater rows): the same
    for every budget, so cached per (encoding, layer)."""
    from transformers import DynamicCache

    key = ("sparsevlm_first", layer)
    if cache is not None and key in cache:
        return cache[key]
    vis = prompt.visual_positions
    after = torch.arange(int(vis.max()) + 1, prompt.length, device=vis.device)
    if after.numel() == 0:
        raise ValueError("SparseVLM rates the visual tokens with the prompt tokens after them: there are none")
    raters = after[text_raters(prompt.embeds[0, vis], prompt.embeds[0, after])]
    prefix = advance(prompt, start(prompt), layer, cache=DynamicCache(config=prompt.lm.config), probe=raters)
    out = (prefix, _attention(prompt, prefix), raters)
    prefix.probe = None
    if cache is not None:
        cache[key] = out
    return out


def _rows(prompt, alive: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Ascending sequence rows present: text, the alive visual tokens, the slots (visual indices)
    of the merged tokens present."""
    vis = prompt.visual_positions
    mask = torch.ones(prompt.length, dtype=torch.bool, device=vis.device)
    mask[vis] = False
    mask[vis[alive]] = True
    mask[vis[slots]] = True
    return torch.nonzero(mask).flatten()


def _select(prompt, k: int, ratio: float, cache: dict | None):
    vis = prompt.visual_positions
    dev, n_v = vis.device, int(vis.numel())
    layers, counts = schedule(k, n_v, prompt.n_layers)
    prefix, att, raters = _first(prompt, layers[0], cache)
    kv = prefill_cache(prompt, prefix)
    alive = torch.ones(n_v, dtype=torch.bool, device=dev)
    survived = torch.zeros(n_v, dtype=torch.long, device=dev)
    stage_scores = torch.full((len(layers), n_v), float("nan"), device=dev)
    merged_into = torch.full((n_v,), -1, dtype=torch.long, device=dev)
    slots, m_stage, parent = (torch.zeros(0, dtype=torch.long, device=dev) for _ in range(3))
    live = slots  # the merged tokens present (those of the previous stage), indices into `slots`
    for s, (layer, count) in enumerate(zip(layers, counts)):
        if s:
            prefix = advance(prompt, prefix, layer, cache=kv, probe=torch.searchsorted(prefix.rows, raters))
            att = _attention(prompt, prefix)
        cand = torch.nonzero(alive).flatten()  # original tokens present, ascending
        which = torch.cat([cand, slots[live]])  # visual index of every visual row present
        seq = vis[which]
        cols = seq if prefix.rows is None else torch.searchsorted(prefix.rows, seq)
        is_m = torch.arange(which.numel(), device=dev) >= cand.numel()
        pick = rank_stage(att, cols, is_m, count, ratio)
        stage_scores[s, cand] = pick.scores[: cand.numel()]
        order = cand[pick.kept]
        survived[order] += 1
        alive[cand] = False
        alive[order] = True
        merge, new = (None, None, None), slots[:0]
        if pick.recycled.numel():
            rec = pick.recycled
            centres, assign = dpc_knn(prefix.hidden[0].index_select(0, cols[rec]), pick.n_clusters)
            base = slots.numel()
            o = rec < cand.numel()
            merged_into[which[rec[o]]] = assign[o] + base
            parent[live[rec[~o] - cand.numel()]] = assign[~o] + base
            new = which[rec[centres]]
            slots = torch.cat([slots, new])
            m_stage = torch.cat([m_stage, torch.full_like(new, s)])
            parent = torch.cat([parent, torch.full_like(new, -1)])
            live = torch.arange(base, slots.numel(), device=dev)
            merge = (vis[new], seq[rec], assign)
        else:
            live = slots[:0]
        prefix = apply_stage(prompt, prefix, Stage(layer, _rows(prompt, alive, new), *merge))
    last = survived.clamp(max=len(layers) - 1)  # the last stage that ranked each token
    scores = survived.float() + stage_scores.gather(0, last[None])[0]
    per_stage = torch.bincount(m_stage, minlength=len(layers)).tolist()
    after = [c + m for c, m in zip(counts, per_stage)]
    sel = Selection.from_order(order, scores)
    sel.extras.update(
        layer=layers[-1], layers=torch.tensor(layers), counts=torch.tensor(counts), survived=survived.cpu(),
        stage_scores=stage_scores.cpu(), raters=raters.cpu(), merged_slot=slots.cpu(), merged_stage=m_stage.cpu(),
        merged_into=merged_into.cpu(), merged_parent=parent.cpu(), recycle_ratio=ratio, n_merged=per_stage[-1],
        equivalent_tokens=equivalent_tokens(layers, after, n_v, prompt.n_layers))
    return sel, prefix


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


@torch.no_grad()
def answer(adapter, encoded, selection: Selection, *, max_new_tokens: int = 64, cache: dict | None = None,
           min_new_tokens: int = 0) -> Answer:
    """Greedy answer on a SparseVLM selection: its stages replayed (or the prefix `select` left in
    `cache` reused), then the remaining layers and decoding. input_tokens: the prompt rows after the
    last stage; visual_tokens: K + the last stage's merged tokens. Timings as `inllm.generate`."""
    def run_layers(prompt) -> Started:
        from transformers import DynamicCache

        hit = None if cache is None else cache.get(_LAST)
        if hit is not None and hit[0] == (selection.budget, selection.extras.get("recycle_ratio")) \
                and torch.equal(hit[1], selection.keep):
            prefix = hit[2]
            kv = prefill_cache(prompt, prefix)
        else:
            kv = DynamicCache(config=prompt.lm.config)
            prefix = run_staged(prompt, stages_of(prompt, selection), cache=kv)
        n_vis = selection.budget + selection.extras["n_merged"]
        return Started(prefix, kv, None, None, int(prefix.rows.numel()), n_vis)

    return timed_greedy(adapter, encoded, cache, max_new_tokens, min_new_tokens, run_layers)


@torch.no_grad()
def prefill_logits(adapter, encoded, selection: Selection) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward pruned as `selection` says: one row
    per prompt row left after the last stage (text, kept and merged visual rows), in prompt order."""
    prompt = _get_prompt(adapter, encoded, None)
    prefix = run_staged(prompt, stages_of(prompt, selection))
    return logits_of(prompt, continue_prefix(prompt, prefix, None))[0].float().cpu()


RECYCLE = Param.real("recycle_ratio", 0.3, 0.0, 1.0, "share of each stage's dropped (and last merged) tokens "
                     "recycled into merged tokens, the most attended first; 0 = none (SparseVLM: 0.3)",
                     code="rec", step=0.05)


@register_pruner("sparsevlm", stage="llm", needs=("adapter",), params=(RECYCLE,), label="SparseVLM", answer=answer)
@torch.no_grad()
def sparsevlm(adapter, encoded, budget, *, cache: dict | None = None, recycle_ratio: float = 0.3) -> Selection:
    """SparseVLM: text raters rank the visual tokens at three layers; dropped ones partly merged."""
    prompt = _get_prompt(adapter, encoded, cache)
    k = budget  # an int in [1, N_V]: mipruner.select resolved it
    key = ("sparsevlm", k, float(recycle_ratio))
    if cache is not None and key in cache:
        sel = cache[key]
    else:
        sel, prefix = _select(prompt, k, float(recycle_ratio), cache)
        if cache is not None:
            cache[key] = sel
            cache[_LAST] = ((k, float(recycle_ratio)), sel.keep, prefix)
    return dataclasses.replace(sel, extras=dict(sel.extras))
