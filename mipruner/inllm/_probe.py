"""The attention row of the last prompt token at one decoder layer, recomputed from what the layer used.

The model runs SDPA, which returns no probabilities; FastV needs one row of them and DART the keys,
so `_decoder.run_prefix` captures the layer's attention input of the last token and its rotary
cos/sin, and this recomputes softmax(q k^T * scaling) with the module's own projections.
"""
from __future__ import annotations

import sys

import torch


def last_token_attention(attn, query_input: torch.Tensor, cos_sin, keys: torch.Tensor,
                         window: int | None = None) -> torch.Tensor:
    """Head-mean attention probabilities (L,) float32 of the last query over all L keys.

    attn: the layer's attention module; query_input (1, 1, d): its input for the last token;
    cos_sin: that token's rotary cos/sin; keys (1, KV, L, d_head) from the cache; window: sliding
    window of the layer (keys older than it get no attention), None for full attention.
    """
    rope = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if rope is None:
        raise NotImplementedError(f"{type(attn).__name__}: no apply_rotary_pos_emb in its module")
    d_head = keys.shape[-1]
    q = attn.q_proj(query_input).view(1, 1, -1, d_head)  # (1, 1, H, d_head)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm over d_head before rotary
        q = attn.q_norm(q)
    q = q.transpose(1, 2)  # (1, H, 1, d_head)
    cos, sin = cos_sin
    q, _ = rope(q, q, cos, sin)
    n_kv, L = keys.shape[1], keys.shape[2]
    groups = q.shape[1] // n_kv  # grouped-query attention: head h reads KV head h // groups
    q = q[0, :, 0].float().view(n_kv, groups, d_head)  # (KV, G, d_head)
    logits = q @ keys[0].float().transpose(1, 2) * float(attn.scaling)  # (KV, G, d) @ (KV, d, L) -> (KV, G, L)
    if window is not None and L > window:
        logits[..., : L - window] = -float("inf")  # the last query sees keys (L-1-window, L-1]
    return logits.softmax(dim=-1).mean(dim=(0, 1))  # (L,)
