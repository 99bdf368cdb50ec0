"""An independent reference for pruning at layer K: the MODEL'S OWN forward on the full sequence,
with the dropped visual tokens hidden as keys in layers >= K only.

Forward pre-hooks on decoder layers K.. replace their `attention_mask` argument by a boolean
(1, 1, q, kv) mask: causal, and no query may read a dropped token's key (a dropped query may read
itself, so no row is empty; its output is never read by a kept row). Layers < K keep the model's
own full causal attention. Positions stay the full sequence's, which is what the pruned run keeps.
The hooks are removed on exit. Decoding goes through the model's forward with a DynamicCache, the
new tokens being visible to everyone.
"""
from __future__ import annotations

import contextlib
import functools

import torch


@contextlib.contextmanager
def hide_from_layer(model, layer: int, dropped: torch.Tensor):
    """dropped: (L,) bool over the prompt sequence; later (generated) positions are never dropped."""
    layers = model.model.language_model.layers

    def pre_hook(i, _module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        q = h.shape[1]
        cache = kwargs.get("past_key_values")
        past = cache.get_seq_length(i) if cache is not None else 0
        kv = past + q
        hidden = torch.zeros(kv, dtype=torch.bool)
        hidden[: dropped.numel()] = dropped[:kv]
        qi = torch.arange(past, kv)[:, None]  # absolute index of each query
        ki = torch.arange(kv)[None, :]
        allowed = (ki <= qi) & (~hidden[None, :] | (ki == qi))
        kwargs["attention_mask"] = allowed[None, None].to(h.device)
        return args, kwargs

    handles = [layers[i].register_forward_pre_hook(functools.partial(pre_hook, i), with_kwargs=True)
               for i in range(layer, len(layers))]
    try:
        yield
    finally:
        for hd in handles:
            hd.remove()


def reference_run(model, inputs: dict, step_inputs, layer: int, dropped: torch.Tensor, max_new_tokens: int):
    """(prompt logits (L, vocab) float32, greedy token ids, margins) of the masked full-sequence model.

    inputs: the prefill kwargs of the model; step_inputs(token, step) -> kwargs of one decoding step.
    margins[i]: the gap between the best and the second-best logit at greedy step i (a near-tie there
    lets another computation of the same logits pick the other token).
    """
    from transformers import DynamicCache

    with torch.no_grad(), hide_from_layer(model, layer, dropped):
        cache = DynamicCache(config=model.config.get_text_config())
        out = model(**inputs, past_key_values=cache, use_cache=True)
        logits = out.logits[0].float()
        token = int(logits[-1].argmax())
        tokens, margins = [token], [_margin(logits[-1])]
        for step in range(1, max_new_tokens):
            out = model(**step_inputs(token, step), past_key_values=cache, use_cache=True)
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            margins.append(_margin(out.logits[0, -1].float()))
    return logits, tokens, margins


def _margin(row: torch.Tensor) -> float:
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])
