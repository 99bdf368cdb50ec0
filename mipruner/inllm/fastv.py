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
  * The release needs eager attention to read the row; we recompute the one row (`StageView.attention("last")`), so the
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

import torch

from ..pruners._registry import Param
from ..pruners.selection import Selection
from .api import DecoderRun, register_inllm

# The decoder layer where an in-LLM method prunes; shared by FastV and DART (one control in the app).
LAYER = Param.integer("layer", 2, 1, None, "decoder layer K where the method prunes (FastV and DART papers: 2)",
                      code="K")


def fastv_rank(attention: torch.Tensor, budget: int) -> Selection:
    """Top-`budget` image tokens by `attention` (N_V,), ties to the lower index."""
    scores = attention.detach().float().cpu()
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    return Selection.from_order(order, scores)


@register_inllm("fastv", label="FastV", params=(LAYER,), score_label="attention share (layer K)")
@torch.no_grad()
def fastv(run: DecoderRun, budget: int, *, layer: int = 2) -> Selection:
    """FastV: the image tokens the last prompt token attends to most at layer K-1."""
    view = run.at(layer)  # one stage at K, on the public in-LLM API (`mipruner.inllm.api`)
    row = view.attention("last")[0]  # (L,) the last prompt token's head-mean attention at layer K-1
    sel = fastv_rank(row[view.columns(run.visual_positions)], budget)
    run.keep(view, sel.keep)
    sel.extras["layer"] = view.layer
    return sel
