"""Qwen's ViT attention for the vision-stage methods: its attention modules return no probabilities,
so one block's softmax(q k^T / sqrt(d)) is recomputed from the block's own inputs and weights in a
forward pre-hook (removed on exit), head-averaged (or kept per head, when a method asks) and pooled
over each 2x2 merge group; several blocks in one pass when methods ask for several."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


def merge_attention(probs: torch.Tensor, merge_unit: int) -> torch.Tensor:
    """(P, P) patch attention -> (N, N) token attention, N = P / merge_unit.

    Token i's row is the mean over its patches (queries) of the attention summed over each key
    token's patches (column-sum style), so rows still sum to 1.
    """
    n = probs.shape[0] // merge_unit
    return probs.view(n, merge_unit, n, merge_unit).sum(3).mean(1)  # (N, N)


def plan_blocks(adapter, want, store: dict):
    """{block: per head?} to capture for a `Signals` request, the default's first (None: nothing asked);
    Qwen2.5-VL moves windowed blocks (`_attention_block`). store["plan"]: (depth, default, {asked: block})."""
    from ..common.signals import plan

    depth = len(adapter.model.model.visual.blocks)
    default = adapter.attention_layer % depth
    asked, heads = plan(want, depth, default, adapter._attention_block)
    store["plan"] = (depth, default, asked)
    return {b: b in heads for b in dict.fromkeys([asked[default], *asked.values()])} if asked else None


@contextmanager
def record(adapter, vision: dict, store: dict, want):
    """The hooks of a `Signals` request on one tower pass: the asked blocks' attention (`capture`) and the
    merger's input (store["merger_in"]), removed on exit."""
    from ..common.signals import projector_input

    blocks = plan_blocks(adapter, want, store)
    with adapter._attention_capture(vision, store, enabled=want.attention, blocks=blocks), \
            projector_input(adapter.model.model.visual.merger, want.features) as seen:
        yield
    store["merger_in"] = seen


def signal_fields(adapter, want, store: dict, grid: torch.Tensor) -> dict:
    """The `Encoded` fields of what `want` asked for: blocks, encoder_depth/_block, features, signals."""
    depth, default, asked = store["plan"]
    fields = {"signals": want}
    if want.attention:
        fields.update(blocks={a: store["blocks"][b] for a, b in asked.items()}, encoder_depth=depth,
                      encoder_block=default)
    if want.features:
        fields["features"] = merger_features(adapter, torch.cat(store["merger_in"]), grid)
    return fields


def merger_features(adapter, merger_in: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The merger's input (P, D) in the ViT's order -> (N_V, m*m*D) in LLM order: each token's m x m patch
    states side by side, as the merger reads them (`merger(features.view(-1, D))` gives `visual`)."""
    unit = adapter.merge ** 2
    f = merger_in.reshape(merger_in.shape[0] // unit, unit * merger_in.shape[-1])  # (N_V, unit * D)
    order = adapter._attention_order(grid)
    return f if order is None else f[torch.argsort(order).to(f.device)]


@contextmanager
def capture(adapter, vision: dict, store: dict, enabled: bool, blocks: dict[int, bool] | None = None):
    """Recompute softmax(q k^T / sqrt(d)) of ViT blocks from their inputs, via removable hooks.

    Qwen's ViT attention returns no probabilities; a forward pre-hook on a block's attention
    module reads its inputs (hidden states, cu_seqlens, rotary cos/sin) and recomputes q, k
    with the module's own weights, per cu_seqlens segment. Heads are averaged and 2x2 merge
    groups pooled (`merge_attention`). The hooks are removed on exit.
    blocks: {block: per head?} the blocks to capture (default: `adapter._attention_block()`, head mean);
    store["blocks"][block] gets "attention" (N_V, N_V), "keys" (N_V, hd) and, per head,
    "attention_heads" (H, N_V, N_V) (each head's map pooled alike), all in LLM order; store["attention"] /
    ["keys"] are the first block's. With store["keep_heads"] set, the first block's per-head (H, P, P)
    probabilities and the values are kept too (tests).
    """
    if not enabled:
        yield
        return
    blocks = blocks or {adapter._attention_block(): False}
    grid = vision.get("image_grid_thw", vision.get("video_grid_thw"))
    unit = adapter.merge ** 2
    raw: dict[int, dict] = {}

    def hook_for(block: int, per_head: bool, first: bool):
        module = adapter.model.model.visual.blocks[block].attn
        rope = sys.modules[type(module).__module__].apply_rotary_pos_emb_vision

        def pre_hook(mod, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            cu = kwargs["cu_seqlens"]
            cos, sin = kwargs["position_embeddings"]
            n = hs.shape[0]
            qkv = mod.qkv(hs).reshape(n, 3, mod.num_heads, -1).permute(1, 0, 2, 3)
            q, k = rope(qkv[0], qkv[1], cos, sin)  # (P, H, hd)
            q, k = q.float().transpose(0, 1), k.float().transpose(0, 1)  # (H, P, hd)
            # head-mean merged attention, one cu_seqlens segment (frame / window) and head at a time:
            # memory O(S^2), not O(H P^2), for large images and long videos
            merged = torch.zeros(n // unit, n // unit, dtype=torch.float32, device=hs.device)
            by_head = (torch.zeros(mod.num_heads, n // unit, n // unit, dtype=torch.float32, device=hs.device)
                       if per_head else None)
            heads = [] if first and store.get("keep_heads") else None
            for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
                mean = torch.zeros(e - s, e - s, dtype=torch.float32, device=hs.device)
                for h in range(mod.num_heads):
                    p_h = (q[h, s:e] @ k[h, s:e].T * mod.scaling).softmax(-1)  # (S, S)
                    mean += p_h / mod.num_heads
                    if by_head is not None:
                        by_head[h, s // unit:e // unit, s // unit:e // unit] = merge_attention(p_h, unit)
                    if heads is not None:
                        heads.append((h, s, e, p_h))
                merged[s // unit:e // unit, s // unit:e // unit] = merge_attention(mean, unit)
            raw[block] = {"merged": merged, "patch_keys": k, "by_head": by_head}
            if heads is not None:  # per-head (H, P, P) probabilities and values, for tests
                probs = torch.zeros(mod.num_heads, n, n, dtype=torch.float32, device=hs.device)
                for h, s, e, p_h in heads:
                    probs[h, s:e, s:e] = p_h
                store["probs"], store["values"] = probs, qkv[2]

        return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

    handles = [hook_for(b, per_head, i == 0) for i, (b, per_head) in enumerate(blocks.items())]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    order = adapter._attention_order(grid)
    inv = None if order is None else torch.argsort(order)  # ViT order -> LLM order
    store["blocks"] = {}
    for b in blocks:
        r = raw[b]
        attention = r["merged"]  # (N_V, N_V)
        keys = r["patch_keys"].mean(0)  # (P, hd)
        keys = keys.view(keys.shape[0] // unit, unit, -1).mean(1)  # (N_V, hd)
        by_head = r["by_head"]
        if inv is not None:
            attention, keys = attention[inv][:, inv], keys[inv]
            by_head = None if by_head is None else by_head[:, inv][:, :, inv]
        entry = {"attention": attention, "keys": keys, "block": b}
        if by_head is not None:
            entry["attention_heads"] = by_head  # (H, N_V, N_V)
        store["blocks"][b] = entry
    first = store["blocks"][next(iter(blocks))]
    store["block"] = next(iter(blocks))
    store["attention"], store["keys"] = first["attention"], first["keys"]  # on the device: the selections read them there
