"""FastV (Chen et al., ECCV 2024): keep the image tokens the last prompt token attends to most.

Rule: at decoder layer K-1, take the attention probabilities of the LAST prompt token
(query) over the whole prompt, average them over heads, and keep the top-`budget` image tokens
by that score; from layer K on only those image tokens (and every text token) remain.
Original defaults: K = 2, drop ratio R = 50% (budget = share 0.5).

Original: pkunlp-icler/FastV, `src/transformers/src/transformers/models/llama/modeling_llama.py`
`LlamaModel.forward` (the `use_fast_v` branch: at layer AGG_LAYER the head-mean attention row of the
last token over the image span, its topk(ATTENTION_RANK), and an attention mask hiding the others
from then on). What matches: the layer, the attention row (last prompt token, head mean, layer K-1),
the top-k. Deliberate deviations, and why:
  * The release keeps the dropped tokens in the sequence and masks them out of attention from
    layer K on; we remove them from layer K on, keeping every token's position. The outputs of the
    kept tokens are the same (tested against the model's own forward with that mask, to 1e-5), and
    the pruned run is actually cheaper.
  * The release needs eager attention to read the row; we recompute the one row (below), so the
    model keeps SDPA. K = 0 (random tokens in the release) is not offered: K >= 1.
  * Ties to the lower index (stable sort); the release's topk leaves them to the kernel.

The model runs SDPA, which returns no probabilities, so we compute that one row ourselves, from
what the layer actually used: its attention input of the last token (captured by a pre-hook in
`_decoder.run_prefix`) goes through the module's own `q_proj` (and `q_norm` where the family has
one) and its module's `apply_rotary_pos_emb`; the keys are the ones the layer wrote into the KV
cache (post-norm, post-rotary). softmax(q k^T * scaling) over the L keys, mean over heads. The
test checks this row against the model's eager `output_attentions`.
"""
from __future__ import annotations

import sys

import torch

from ..pruners._registry import Param, register_pruner
from ..pruners.selection import Selection
from ._run import answer, prepare

# The decoder layer where an in-LLM method prunes; shared by FastV and DART (one control in the app).
LAYER = Param.integer("layer", 2, 1, None, "decoder layer K where the method prunes (FastV and DART papers: 2)",
                      code="K")


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


def fastv_rank(attention: torch.Tensor, budget: int) -> Selection:
    """Top-`budget` image tokens by `attention` (N_V,), ties to the lower index."""
    scores = attention.detach().float().cpu()
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    return Selection.from_order(order, scores)


@register_pruner("fastv", stage="llm", needs=("adapter",), params=(LAYER,), label="FastV", answer=answer,
                 score_label="attention share (layer K)")
@torch.no_grad()
def fastv(adapter, encoded, budget, *, cache: dict | None = None, layer: int = 2) -> Selection:
    """FastV: the image tokens the last prompt token attends to most at layer K-1."""
    prompt, layer, k, prefix = prepare(adapter, encoded, budget, layer, cache)
    sel = fastv_rank(prefix.last_attention[prompt.visual_positions], k)
    sel.extras["layer"] = layer
    return sel
