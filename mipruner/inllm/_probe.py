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


def _rope(attn):
    rope = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if rope is None:
        raise NotImplementedError(f"{type(attn).__name__}: no apply_rotary_pos_emb in its module")
    return rope


def _probabilities(q: torch.Tensor, keys: torch.Tensor, scaling: float, query_index: torch.Tensor,
                   window: int | None, per_head: bool = False) -> torch.Tensor:
    """q (1, H, R, d_head) after rotary, keys (1, KV, L, d_head): head-mean softmax (R, L) float32,
    causal (query i sees keys <= query_index[i]) and sliding-window masked; per_head: (H, R, L),
    head h (reading KV head h // G, as the model's repeat_kv) in the model's head order."""
    d_head, r = keys.shape[-1], q.shape[2]
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    q = q[0].float().view(n_kv, -1, r, d_head)  # grouped-query attention: head h reads KV head h // G
    logits = q @ keys[0].float().transpose(1, 2)[:, None] * float(scaling)  # (KV, G, R, L)
    j = torch.arange(n_keys, device=keys.device)[None, :]
    qi = query_index.to(keys.device)[:, None]
    hidden = j > qi
    if window is not None:
        hidden = hidden | (j <= qi - window)
    p = logits.masked_fill(hidden, -float("inf")).softmax(dim=-1)
    return p.reshape(-1, r, n_keys) if per_head else p.mean(dim=(0, 1))


def rater_attention(attn, query_input: torch.Tensor, cos_sin, keys: torch.Tensor, query_index: torch.Tensor,
                    window: int | None = None, per_head: bool = False) -> torch.Tensor:
    """Head-mean attention probabilities (R, L) float32 of R queries over the L cached keys
    (per_head: (H, R, L)).

    query_input (1, R, d): the layer's attention input at those rows; cos_sin: their rotary cos/sin;
    keys (1, KV, L, d_head); query_index (R,): each query's place among the keys (causal mask);
    window: the layer's sliding window or None.
    """
    rope = _rope(attn)
    d_head, r = keys.shape[-1], query_input.shape[1]
    q = attn.q_proj(query_input).view(1, r, -1, d_head)
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
    q, _ = rope(q.transpose(1, 2), q.transpose(1, 2), *cos_sin)  # (1, H, R, d_head)
    return _probabilities(q, keys, attn.scaling, query_index, window, per_head)


def layer_attention(block, hidden: torch.Tensor, cos_sin, query_index: torch.Tensor,
                    window: int | None = None, per_head: bool = False) -> torch.Tensor:
    """Head-mean attention probabilities (R, L) float32 that decoder layer `block` would compute on
    its input `hidden` (1, L, d) for the query rows `query_index` (R,), before running it: its input
    norm, q/k projections (and q_norm/k_norm), rotary with `cos_sin` (L rows), causal/window mask."""
    attn = block.self_attn
    rope = _rope(attn)
    x = block.input_layernorm(hidden)
    n = x.shape[1]
    d_head = getattr(attn, "head_dim", None) or attn.k_proj.out_features // attn.config.num_key_value_heads
    q = attn.q_proj(x.index_select(1, query_index)).view(1, query_index.numel(), -1, d_head)
    k = attn.k_proj(x).view(1, n, -1, d_head)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = cos_sin
    q, _ = rope(q.transpose(1, 2), q.transpose(1, 2), cos.index_select(-2, query_index),
                sin.index_select(-2, query_index))
    k, _ = rope(k.transpose(1, 2), k.transpose(1, 2), cos, sin)  # (1, KV, L, d_head)
    return _probabilities(q, k, attn.scaling, query_index, window, per_head)
