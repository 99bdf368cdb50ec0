"""LLaVA-PruMerge (Shang et al., "LLaVA-PruMerge: Adaptive Token Reduction for Efficient Large
Multimodal Models", arXiv 2403.15388), a pre-LLM plug-in written only on mipruner's public API
(`mipruner.register_pruner`, `Param`, `Selection`): it chooses K per input (`adaptive=True`, the
budget is its cap) and returns merged tokens (`Selection.tokens`) plus one extra token
(`Selection.prefix`).

Original: 42Shawn/LLaVA-PruMerge, `llava/model/multimodal_encoder/clip_encoder.py`,
`CLIPVisionTower.token_prune_merge_advanced` (PruMerge; `outlier_dectection` for the IQR rule,
`complement_idx`). The released rule, on the [CLS] attention a (N,), the keys k (N, c) and the
features x (N, C) of the N patches:
  1. K: the patches whose [CLS] attention is an IQR outlier, a > Q3 + 1.5 (Q3 - Q1) (numpy's
     linear percentiles), counted: left = int(N * (count / N));
  2. kept: the `left` patches with the largest [CLS] attention (topk);
  3. merge: each kept patch i takes the 32 patches most similar to it by cosine of the keys among
     all the others (the other kept ones included), and becomes x_i + sum_j a_j x_j over them
     (weights: their [CLS] attention, not normalised);
  4. one extra token: sum over the patches not kept of a_j x_j, appended after the kept ones.
So left + 1 tokens reach the LLM.

Ours, and every deliberate deviation:
  * inputs: the encoder's signals mipruner gives a "vision" method (docs/plugins.md): `attention`
    (N+1, N+1) head-mean probabilities of the feature layer, [CLS] first, and `keys` (N+1, d_head)
    head-mean keys of that layer. The release computes one full-width "head" from the LAST layer's
    q_proj / k_proj outputs (q k^T / sqrt(C), C = 1024) and merges the pre-projector features; we
    take the head-mean attention and keys of the feature layer and merge the projected tokens
    (`visual`). Without a [CLS] (Qwen, Video-LLaVA video) a patch's score is the attention it
    receives from the others (column mean), as the `attention` built-in does.
  * the budget caps K: at most budget - 1 outliers and the extra token (budget 1: the top patch,
    no extra token); at least one patch is kept when there is no outlier (the release keeps none);
  * the extra token is fed before the kept tokens (`Selection.prefix`; the release appends it);
  * a cluster has min(32, N - 1) members (the release's topk fails below 33 patches); ties go to
    the lower index (stable sorts; the release's topk leaves them to the kernel).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mipruner import Param, Selection, register_pruner

CLUSTER = 32  # released: topk(cos_sim, k=int(32))
MEMBERS = Param.integer("prumerge_members", CLUSTER, 1, None, "patches merged into each kept one, by key "
                        "cosine (LLaVA-PruMerge: 32)", code="pmk")


def cls_scores(attention: torch.Tensor, n: int) -> tuple[torch.Tensor, bool]:
    """((N,) float32 [CLS] attention of each patch, has [CLS]) from (N+1, N+1) or (N, N) attention."""
    a = attention.float()
    if tuple(a.shape) == (n + 1, n + 1):
        return a[0, 1:], True
    if tuple(a.shape) == (n, n):
        return a.mean(dim=0), False
    raise ValueError(f"attention must be ({n + 1}, {n + 1}) or ({n}, {n}) for {n} visual tokens, got {tuple(a.shape)}")


def iqr_count(scores: torch.Tensor) -> int:
    """`left` of the release: int(N * (outliers / N)), outliers above Q3 + 1.5 IQR (linear percentiles)."""
    q1, q3 = torch.quantile(scores.double(), torch.tensor([0.25, 0.75], dtype=torch.float64, device=scores.device))
    count = int((scores.double() > q3 + 1.5 * (q3 - q1)).sum())
    n = int(scores.numel())
    return int(n * (count / n))


def merge_kept(scores: torch.Tensor, keys: torch.Tensor, x: torch.Tensor, kept: torch.Tensor,
               members: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(merged (K, C) in `kept` order, extra (1, C), clusters (K, m) patch indices) as released:
    x_i + sum of a_j x_j over the m patches (other than i) with the most similar keys; the extra
    token the a-weighted sum of the patches not kept."""
    n = scores.numel()
    unit = F.normalize(keys.float(), p=2, dim=-1)  # (N, c)
    sim = unit.index_select(0, kept) @ unit.T  # (K, N)
    sim[torch.arange(kept.numel(), device=kept.device), kept] = -float("inf")  # "the rest": not i itself
    m = min(members, n - 1)
    clusters = torch.sort(sim, dim=1, descending=True, stable=True).indices[:, :m]  # (K, m)
    xf = x.float()
    w = scores.float()
    merged = xf.index_select(0, kept) + (xf[clusters] * w[clusters][..., None]).sum(dim=1)
    dropped = torch.ones(n, dtype=torch.bool, device=kept.device)
    dropped[kept] = False
    extra = (xf * (w * dropped)[:, None]).sum(dim=0, keepdim=True)
    return merged, extra, clusters


def merged_into(scores: torch.Tensor, keys: torch.Tensor, kept: torch.Tensor, clusters: torch.Tensor) -> torch.Tensor:
    """(N,) for the app's merge map: each dropped patch's kept patch, the one of the clusters holding
    it whose key is most similar (a patch can join several clusters); -1 for patches in none."""
    n = scores.numel()
    unit = F.normalize(keys.float(), p=2, dim=-1)
    member = torch.zeros(kept.numel(), n, dtype=torch.bool, device=kept.device)
    member.scatter_(1, clusters, True)
    sim = torch.where(member, unit.index_select(0, kept) @ unit.T, -float("inf"))  # (K, N)
    best = sim.max(dim=0)
    out = torch.where(torch.isfinite(best.values), kept[best.indices], torch.full_like(best.indices, -1))
    out[kept] = -1  # kept patches are targets, not merged ones
    return out


@register_pruner("prumerge", stage="vision", needs=("attention", "keys"), params=(MEMBERS,), adaptive=True,
                 label="LLaVA-PruMerge (example plug-in)", score_label="[CLS] attention share")
def prumerge(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *, attention: torch.Tensor | None = None,
             keys: torch.Tensor | None = None, prumerge_members: int = CLUSTER) -> Selection:
    """LLaVA-PruMerge: IQR outliers of the [CLS] attention, each merged with its most similar patches."""
    n = visual.shape[0]
    if attention is None or keys is None:
        raise ValueError("prumerge needs the vision encoder's attention and keys (encode with need_attention=True)")
    scores, cls = cls_scores(attention, n)
    k = keys[1:] if cls else keys
    extra_ok = budget >= 2
    left = max(1, min(iqr_count(scores), budget - 1 if extra_ok else 1))
    order = torch.sort(scores, descending=True, stable=True).indices[:left]  # topk(cls_attn, left)
    merged, extra, clusters = merge_kept(scores, k, visual, order, prumerge_members)
    rank = torch.argsort(order)  # the merged rows in `keep` order (ascending index)
    sel = Selection.from_order(order, scores, tokens=merged.index_select(0, rank).to(visual.dtype),
                               prefix=extra.to(visual.dtype) if extra_ok else None)
    sel.merged_into = merged_into(scores, k, order, clusters)
    sel.extras.update(clusters=clusters, outliers=left)
    return sel
