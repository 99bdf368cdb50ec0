"""The rows of a batch prefilled as padded batches grouped by length, then decoded as one batch.

A batch's rows (the unpruned reference and the pruned rows of one view: 591 and 5 x 79 tokens at
LLaVA-1.5's shape; or 32 items' prompts of about one length) are sorted by length and cut into
groups of about one length (`groups`): on the plain path a row joins the group of the longest row
not yet placed while it is at least `RATIO` of that row's length; with a bucket, rows of one bucketed
length form a group. Each group runs ONE prefill forward as a left-padded batch (n_g, W_g) with a 2-D
attention mask and explicit positions, the input `generate` itself gives the model: attention work
and memory grow with n_g W_g^2 (at most 1 / RATIO^2 of the rows' own sum of L_i^2), never with the
square of the rows' summed lengths (the (S, S) mask of one packed sequence did that: at batch 32,
S = 18.9k, 32 times the work and 1.4 GB of mask at batch 64).

The groups' caches are then joined into one left-padded cache of the longest group's width W
(`join`: each group's keys and values padded on the left, rows in group order), or written into a
static cache, and the greedy loop decodes all rows at once, each step one (B, 1) forward with a
(B, W + t) mask, as `generate` does for a batch padded to its longest row. A batch whose rows fall in
one group (e.g. 32 unpruned items) is exactly `generate`'s prefill shape, and its cache is used as it
is (nothing copied).

A family supplies only what differs (`Rows`): the prefill inputs of a list of its rows left-padded to
a width, the prefill forward, each row's first decoding position and how a step's positions are
written (LLaVA: (B, 1); Qwen's M-RoPE: (3, B, 1)). What a row computes differs from its one-by-one run
only by float rounding (masked kernels, other matmul shapes): tests/models/test_rows.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .path import left_pad, round_up

RATIO = 0.8  # on the plain path a row joins a group while its length is >= RATIO x the group's longest


def batch_bucket(n: int) -> int:
    """The power of two >= n: the row counts a compiled forward sees (a fixed set)."""
    return 1 << max(0, int(n) - 1).bit_length()


def groups(lengths: list[int], bucket: int = 0) -> list[list[int]]:
    """Row indices cut into groups of about one length, longest first (module docstring)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out:
            head = lengths[out[-1][0]]
            if (round_up(lengths[i], bucket) == round_up(head, bucket)) if bucket else lengths[i] >= RATIO * head:
                out[-1].append(i)
                continue
        out.append([i])
    return [sorted(g) for g in out]  # a group's rows in the batch's order (one group: the batch as it is)


@dataclass
class Rows:
    """What a family gives the engine for a batch of B rows.

    lengths: each row's prompt length. inputs(idx, width): the prefill inputs of rows `idx` (a row may
    repeat: pad rows of a compiled shape) left-padded to `width`, a dict `prefill` takes. prefill(model,
    inputs) -> (last-token logits (n, V), the cache). next_pos: (B,) each row's first decoding position.
    step_positions(pos (B,)) -> the position_ids of one decoding step."""

    lengths: list[int]
    inputs: Callable[[list[int], int], dict]
    prefill: Callable
    next_pos: torch.Tensor
    step_positions: Callable[[torch.Tensor], torch.Tensor]


def join(caches: list, widths: list[int], counts: list[int], width: int, cache, select: torch.Tensor | None = None):
    """Write the groups' caches (first `counts[g]` rows of each, (n, H, widths[g], D) per layer) into
    `cache` (an empty DynamicCache or StaticCache) as one left-padded (B, H, width, D) block per layer,
    rows in group order (then `select`: a row index, e.g. repeating a row to fill a compiled shape). The
    groups' caches are emptied layer by layer as they are copied (they are the caller's to drop)."""
    import torch.nn.functional as F

    for i in range(len(caches[0].layers)):
        ks, vs = [], []
        for c, w, n in zip(caches, widths, counts):
            layer = c.layers[i]
            ks.append(F.pad(layer.keys[:n], (0, 0, width - w, 0)))
            vs.append(F.pad(layer.values[:n], (0, 0, width - w, 0)))
            layer.keys = layer.values = None  # the group's layer is copied: free it (peak ~ the joined cache)
        k, v = torch.cat(ks), torch.cat(vs)
        if select is not None:
            k, v = k.index_select(0, select), v.index_select(0, select)
        cache.update(k.contiguous(), v.contiguous(), i)
    return cache


def prefill(model, spec: Rows, bucket: int, pad_rows: bool, forward=None):
    """Prefill `spec`'s rows group by group (module docstring). Returns (first logits (B', V), the
    group caches, their widths, their real row counts, the row order (B' entries: groups' rows, then
    repeats of the first row up to a batch bucket when `pad_rows`), the (B', W) mask of real columns)."""
    forward = forward or spec.prefill
    parts = groups(spec.lengths, bucket)
    logits, caches, widths, counts, order, masks = [], [], [], [], [], []
    for g in parts:
        w = round_up(max(spec.lengths[i] for i in g), bucket)
        idx = g + [g[0]] * (batch_bucket(len(g)) - len(g)) if pad_rows else g
        lg, cache = forward(model, spec.inputs(idx, w))
        logits.append(lg[:len(g)])
        caches.append(cache)
        widths.append(w)
        counts.append(len(g))
        order += g
    width = max(widths)
    device = logits[0].device
    lengths = torch.tensor([spec.lengths[i] for i in order], dtype=torch.long, device=device)
    mask = (torch.arange(width, device=device)[None, :] >= (width - lengths)[:, None]).long()
    first = torch.cat(logits)
    if pad_rows and batch_bucket(len(order)) > len(order):
        extra = batch_bucket(len(order)) - len(order)
        first = torch.cat([first, first[:1].expand(extra, -1)])
        mask = torch.cat([mask, mask[:1].expand(extra, -1)])
        order = order + [order[0]] * extra
    return first, caches, widths, counts, order, mask


def embeds_prefill(model, inputs: dict):
    """The prefill forward of a left-padded batch given as `inputs_embeds` (with its 2-D attention mask
    and explicit positions): last-token logits (n, V) and its cache."""
    out = model(inputs_embeds=inputs["inputs_embeds"], attention_mask=inputs["attention_mask"],
                position_ids=inputs["position_ids"], logits_to_keep=1, use_cache=True)
    return out.logits[:, -1], out.past_key_values


__all__ = ["RATIO", "Rows", "batch_bucket", "embeds_prefill", "groups", "join", "left_pad", "prefill", "round_up"]
