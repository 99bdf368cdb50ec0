"""Qwen-VL's prefill on the compiled path: every input of the compiled forward has the (bucketed) rows
and width as its only sizes, so one graph serves every kept count of a bucket.

The plain path's prefill (`batch.py`) passes the kept visual rows as `mm_encoder_outputs`:
their count changes with the kept count (a new graph per kept count), and the forward breaks its
graph where it checks them (`torch._dynamo.explain` of the model's forward on a packed batch, torch
2.13, transformers 5.23: Qwen2-VL 4 breaks, at `Tensor.item()` in `get_placeholder_mask`'s
`torch_compilable_check`; Qwen3-VL 10, those and `aten.nonzero` of the deepstack addition's boolean
index `hidden_states[visual_pos_masks]`, whose output size depends on the data). Here the same
operations run before it, on the padded rows, with the model's own modules:

  * `inputs_embeds`: `embed_tokens(input_ids)` with the visual rows written at the placeholders by
    `masked_scatter`, image rows then video rows (what `Qwen2VLModel.forward` /
    `Qwen3VLModel.forward` do with `mm_encoder_outputs`);
  * Qwen3-VL's deepstack: per injected layer, a (n, W, d) tensor holding each visual row's feature at
    its placeholder and zeros elsewhere (the same scatter), added to the hidden states after that
    layer. Adding zero leaves the other positions as they are, so this is the value of the model's
    masked addition (`Qwen3VLTextModel._deepstack_process`) at every position.

Qwen2-VL / Qwen2.5-VL then run the model's forward on `inputs_embeds` (M-RoPE positions (3, n, W)
passed, the 2-D mask): `common.rows.embeds_prefill`. Qwen3-VL runs
the text decoder's public submodules in the order its forward calls them (the mask from
transformers' `create_causal_mask`, `rotary_emb` once, each layer, the deepstack addition, `norm`, the
output head on the rows' last tokens), as `mipruner/inllm/_decoder.py` does for the in-LLM methods.
"""
from __future__ import annotations

import torch

from ..common.rows import embeds_prefill


def placed_embeds(embed, tokens: dict, pk: dict) -> dict:
    """The prefill's inputs (`batch.padded_inputs`) with the visual rows placed: inputs_embeds (n, W, d),
    attention_mask, position_ids (3, n, W) and `deepstack` (Qwen3-VL: one (n, W, d) tensor per injected
    layer; else None). embed: the model's input embeddings; tokens: {"image": id, "video": id}, the
    placeholder ids."""
    ids = pk["input_ids"]
    embeds = embed(ids)
    deep: list[torch.Tensor] | None = None
    for modality in ("image", "video"):
        out = pk["mm_encoder_outputs"].get(modality)
        if out is None:
            continue
        where = (ids == tokens[modality]).unsqueeze(-1)  # (n, W, 1): the placeholders, in row-major order
        rows = torch.cat(tuple(out.pooler_output), dim=0).to(embeds.device, embeds.dtype)
        embeds = embeds.masked_scatter(where, rows)
        features = getattr(out, "deepstack_features", None)
        if features is not None:
            if deep is None:
                deep = [torch.zeros_like(embeds) for _ in features]
            deep = [d.masked_scatter(where, torch.cat(tuple(f), dim=0).to(embeds.device, embeds.dtype))
                    for d, f in zip(deep, features)]
    return dict(inputs_embeds=embeds, attention_mask=pk["attention_mask"], position_ids=pk["position_ids"],
                deepstack=deep)


def placed_prefill(model, packed: dict):
    """The prefill forward on `placed_embeds`' inputs: the rows' last-token logits (n, V) and their
    cache (module docstring)."""
    if packed["deepstack"] is None:
        return embeds_prefill(model, packed)
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    lm = model.model.language_model
    h = packed["inputs_embeds"]
    cache = DynamicCache(config=lm.config)
    mask = create_causal_mask(config=lm.config, inputs_embeds=h, attention_mask=packed["attention_mask"],
                              past_key_values=cache, position_ids=None)
    position_embeddings = lm.rotary_emb(h, packed["position_ids"])
    deep = packed["deepstack"]
    for i, layer in enumerate(lm.layers):
        h = layer(h, attention_mask=mask, position_ids=None, past_key_values=cache,
                  position_embeddings=position_embeddings)
        if i < len(deep):
            h = h + deep[i]
    h = lm.norm(h)
    return model.lm_head(h[:, -1]), cache


__all__ = ["placed_embeds", "placed_prefill"]
