"""Qwen's ViT attention for the vision-stage methods: its attention modules return no probabilities,
so one block's softmax(q k^T / sqrt(d)) is recomputed from the block's own inputs and weights in a
forward pre-hook (removed on exit), head-averaged and pooled over each 2x2 merge group."""
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


@contextmanager
def capture(adapter, vision: dict, store: dict, enabled: bool):
    """Recompute softmax(q k^T / sqrt(d)) of one ViT block from its inputs, via a removable hook.

    Qwen's ViT attention returns no probabilities; a forward pre-hook on the block's attention
    module reads its inputs (hidden states, cu_seqlens, rotary cos/sin) and recomputes q, k
    with the module's own weights, per cu_seqlens segment. Heads are averaged and 2x2 merge
    groups pooled (`merge_attention`). The hook is removed on exit. With store["keep_heads"]
    set, the per-head (H, P, P) probabilities and the values are kept too (tests).
    """
    if not enabled:
        yield
        return
    block = adapter._attention_block()
    module = adapter.model.model.visual.blocks[block].attn
    rope = sys.modules[type(module).__module__].apply_rotary_pos_emb_vision
    grid = vision.get("image_grid_thw", vision.get("video_grid_thw"))

    unit = adapter.merge ** 2

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
        heads = [] if store.get("keep_heads") else None
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            mean = torch.zeros(e - s, e - s, dtype=torch.float32, device=hs.device)
            for h in range(mod.num_heads):
                p_h = (q[h, s:e] @ k[h, s:e].T * mod.scaling).softmax(-1)  # (S, S)
                mean += p_h / mod.num_heads
                if heads is not None:
                    heads.append((h, s, e, p_h))
            merged[s // unit:e // unit, s // unit:e // unit] = merge_attention(mean, unit)
        store["merged"] = merged
        store["patch_keys"] = k
        store["block"] = block
        if heads is not None:  # per-head (H, P, P) probabilities and values, for tests
            probs = torch.zeros(mod.num_heads, n, n, dtype=torch.float32, device=hs.device)
            for h, s, e, p_h in heads:
                probs[h, s:e, s:e] = p_h
            store["probs"], store["values"] = probs, qkv[2]

    handle = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
    attention = store["merged"]  # (N_V, N_V)
    keys = store["patch_keys"].mean(0)  # (P, hd)
    keys = keys.view(keys.shape[0] // unit, unit, -1).mean(1)  # (N_V, hd)
    order = adapter._attention_order(grid)
    if order is not None:  # ViT order -> LLM order
        inv = torch.argsort(order)
        attention, keys = attention[inv][:, inv], keys[inv]
    store["attention"], store["keys"] = attention, keys  # on the device: the selections read them there
