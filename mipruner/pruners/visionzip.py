"""VisionZip (Yang et al. 2025, "VisionZip: Longer is Better but Not Necessary in Vision Language Models").

Original: dvlab-research/VisionZip, `visionzip/clip_encoder.py` `CLIPVisionTower_VisionZip.forward`
(the selection and merge) and `visionzip/main.py` `visionzip(model, dominant, contextual)`, which
passes `dominant_num = dominant - 1`: the released `dominant` count INCLUDES [CLS]. Its documented
setting for 64 tokens is dominant=54, contextual=10, i.e. [CLS] + 53 patches + 10 merged tokens.

    K tokens reach the LLM. With P [CLS] rows supplied (`cls`, one per view; P < K < N_V):
        D = round(dominant_ratio * K)  (at most K - 1: at least one contextual token when K >= 2)
        the P [CLS] rows, D - P dominant patches, C = K - D contextual tokens
    without `cls` (Qwen: no [CLS]; or K <= P; or K = N_V): D dominant patches and C = K - D contextual.
    dominant:   the D - P (or D) patches of highest Attn_i (attention.py's score: head-mean
                A[cls, 1+i], or sum_{j != i} A[j, i] when the encoder has no [CLS])
    contextual: the other patches R (index order) and their keys k~ (head-averaged, L2-normalised);
                C targets at positions 0, s, 2s, ... of R with stride s = max(1, floor(|R| / C));
                every other token r of R goes to its most similar target argmax_t cos(k~_r, k~_t);
                token_t := v_t + mean_{r -> t} v_r      (v_t unchanged when nothing is assigned)
    Selection: keep = dominant + targets (the K - P patch positions masks show); tokens = their K - P
    replacement rows in `keep` order; prefix = the P [CLS] rows (they reach the LLM first, as in
    the original). Rows are computed in float32 and returned in `visual`'s dtype.

What matches the release: the dominant count with [CLS] counted in it, the stride targets over the
remaining tokens in index order, the assignment by cosine of the head-mean keys of the same layer
(argmax: first target on ties), the merge target + mean(assigned), and the default split (54 of 64,
108 of 128, 162 of 192: the ratio 54/64 gives exactly the released settings).

Deliberate deviations, and why:
  * Inputs after the projector. The original merges the tower's hidden states and projects the
    result; pruners here see the projected tokens (what the LLM reads), so we merge rows of `visual`
    with the same assignment. The projector is not linear (LLaVA's MLP has a GELU), so a merged row
    differs from projecting a merged hidden state; dominant rows and [CLS] are identical (the
    adapter projects the [CLS] hidden state itself).
  * Token order in the LLM. The original concatenates [CLS, dominant (index order), contextual
    (target order)]; the adapters splice every kept row at its own image position (with the [CLS]
    rows just before the first one), so positions keep the image layout.
  * One selection over all tokens. On LLaVA-NeXT (base view + tiles) and several images the original
    runs per view with its own budget each; here one budget covers all views (row 0 of `attention`
    is each token's [CLS] attention in its own view) and every view's [CLS] is one of the K.
  * No [CLS] (Qwen2/2.5/3-VL; Video-LLaVA video, whose frames' [CLS] are visual tokens already):
    nothing is prepended and K counts patches only, D = round(ratio K) dominant by the column-sum
    attention (what the paper's "Attention" baseline does on Qwen), the rest merged as above. On
    Qwen the adapter has already pooled the attention over each 2x2 merge group.
  * Small and full budgets: with K <= P no [CLS] is kept (at least one patch is); at K = N_V the
    unpruned input is kept (no [CLS], nothing merged), so keep-all is the unpruned model.
Cost: O(N_V log N_V) for the dominant top-K plus O(|R| C d_k) for the assignment; no host sync.
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .attention import attention_scores, image_keys
from .selection import Selection, check_matrix, top_indices, unit_rows


def dominant_count(budget: int, ratio: float) -> int:
    """D = round(ratio * K) (half up), leaving at least one contextual token when K >= 2."""
    d = int(math.floor(ratio * budget + 0.5))
    return min(d, budget - 1) if budget >= 2 else min(d, budget)


def _complement(n: int, chosen: torch.Tensor, device) -> torch.Tensor:
    """The indices of range(n) not in `chosen`, ascending: (n - len(chosen),), without a host sync."""
    # a fill: no host scalar copied (capturable); out of place, so a batched call (`torch.vmap`) can fill it
    mark = torch.zeros(n, dtype=torch.int8, device=device).index_fill(0, chosen, 1)
    return torch.argsort(mark, stable=True)[: n - chosen.numel()]  # the unmarked come first, in index order


@register_pruner("visionzip", stage="vision", capture=Capturable(), needs=("attention", "keys"), label="VisionZip",
                 score_label="attention share", params=(
    Param.real("dominant_ratio", 54 / 64, 0.0, 1.0, "share of the budget kept as dominant tokens, [CLS] included "
               "(original: 54 of 64)", code="dom", step=0.01),))
def visionzip_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
              attention: torch.Tensor | None = None,
              keys: torch.Tensor | None = None,
              cls: torch.Tensor | None = None,  # (P, d) projected [CLS] rows, one per view; None: none
              dominant_ratio: float = 54 / 64,  # original: 64 tokens = [CLS] + 53 dominant + 10 contextual
              ) -> Selection:
    """VisionZip: keep [CLS] and the top tokens by [CLS] attention, merge the rest into a few contextual ones."""
    ratio = dominant_ratio  # in [0, 1]: checked by its Param where it came in (prune / select)
    n_v = visual.shape[0]
    dev = visual.device
    attn = attention_scores(attention, n_v, method="visionzip").to(dev)  # (N_V,)
    k_img = image_keys(keys, attention, n_v, method="visionzip").to(dev)  # (N_V, d_k)
    n_cls = 0
    if cls is not None:
        check_matrix("cls", cls)
        if cls.shape[1] != visual.shape[1]:
            raise ValueError(f"cls must be (P, {visual.shape[1]}) projected [CLS] rows, got {tuple(cls.shape)}")
        if attention.shape[0] != n_v + 1:
            raise ValueError("cls= needs attention with a [CLS] row ((N_V+1, N_V+1)); this attention has none")
        n_cls = cls.shape[0] if cls.shape[0] < budget < n_v else 0  # see the module doc
    n_dom_all = dominant_count(budget, ratio)  # [CLS] counted in, as released
    n_dom = max(n_dom_all - n_cls, 0)  # dominant patches
    n_patch = budget - n_cls  # patch tokens kept: dominant + contextual
    n_ctx = n_patch - n_dom
    dominant = top_indices(attn, n_dom)  # (D,) highest attention first, ties to the lowest index
    rest = _complement(n_v, dominant, dev)  # (N_V - D,) ascending

    v = visual.to(torch.float32)
    merged_into = torch.arange(n_v, device=dev)  # (N_V,) the kept token each token ends up in
    targets = rest[:0]
    delta = v[:0]  # (C, d) what merging adds to each target
    if n_ctx > 0:
        stride = max(1, rest.numel() // n_ctx)
        slots = torch.arange(0, rest.numel(), stride, device=dev)[:n_ctx]  # (C,) uniform stride over R
        targets = rest[slots]  # (C,)
        others = rest[_complement(rest.numel(), slots, dev)]  # (|R| - C,) ascending
        delta = v.new_zeros(n_ctx, v.shape[1])  # (C, d)
        if others.numel() > 0:
            u = unit_rows(k_img)  # (N_V, d_k), zero rows stay zero
            assign = (u[others] @ u[targets].T).argmax(dim=1)  # (|R| - C,) most similar target slot
            # one-hot matmul, not index_add: CUDA's index_add sums with atomics in no fixed order, so its
            # merged rows differed in the last bits from call to call (seen on an H100); a matmul does not
            onehot = (assign[:, None] == torch.arange(n_ctx, device=dev)[None, :]).to(v.dtype)  # (|R| - C, C)
            sums = onehot.T @ v[others]  # (C, d) sum of assigned rows
            counts = onehot.sum(0)  # (C,)
            delta = sums / counts.clamp_min(1.0)[:, None]  # (C, d) mean of assigned rows (0 if none)
            merged_into = merged_into.index_put((others,), targets[assign])  # out of place: vmap-able

    order = torch.cat([dominant, targets])  # (K - P,) dominant by attention, then targets in stride order
    keep, _ = torch.sort(order)
    tokens = v[keep]  # (K - P, d)
    at = torch.searchsorted(keep, targets)  # (C,) distinct rows of `tokens`
    tokens = tokens.index_put((at,), tokens[at] + delta)  # contextual rows := target + mean(assigned)
    prefix = cls[:n_cls].to(visual.dtype) if n_cls else None
    return Selection.from_order(order, attn, tokens=tokens.to(visual.dtype), prefix=prefix,
                                extras={"merged_into": merged_into, "dominant": dominant})
