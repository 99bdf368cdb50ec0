"""An independent reference for pruning at layer K: the MODEL'S OWN forward on the full sequence,
with the dropped visual tokens hidden as keys in layers >= K only (and, for several stages, more
tokens hidden from each later stage's layer on, merged tokens written into their slots).

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
def hide_by_stage(model, stages, *, additive: bool = False):
    """Several pruning stages on the model's own forward.

    stages: ascending-layer list of (layer, hidden, merges): from decoder layer `layer` on (until the
    next stage) the prompt rows where `hidden` (L,) bool is True are hidden as keys (each stage
    lists every row hidden from it on); merges: list of (row, members (P,) LongTensor): on the
    prompt pass, the hidden state entering `layer` at `row` is replaced by the mean of those at
    `members` (a merged token in the slot of `row`). Generated positions are never hidden.
    additive: a float mask (0 / -inf, for eager attention, which adds the mask) instead of a bool one.
    """
    layers = model.model.language_model.layers

    def pre_hook(i, stage, _module, args, kwargs):
        layer, dropped, merges = stage
        h = args[0] if args else kwargs["hidden_states"]
        q = h.shape[1]
        cache = kwargs.get("past_key_values")
        past = cache.get_seq_length(i) if cache is not None else 0
        if i == layer and merges and past == 0:  # the prompt pass enters the stage's first layer
            h = h.clone()
            for row, members in merges:
                h[0, row] = h[0, members].mean(0)
            if args:
                args = (h,) + tuple(args[1:])
            else:
                kwargs["hidden_states"] = h
        kv = past + q
        hidden = torch.zeros(kv, dtype=torch.bool)
        hidden[: dropped.numel()] = dropped[:kv]
        qi = torch.arange(past, kv)[:, None]  # absolute index of each query
        ki = torch.arange(kv)[None, :]
        allowed = (ki <= qi) & (~hidden[None, :] | (ki == qi))
        mask = allowed[None, None].to(h.device)
        if additive:
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill(~mask, -float("inf"))
        kwargs["attention_mask"] = mask
        return args, kwargs

    handles = []
    for i in range(len(layers)):
        active = [st for st in stages if st[0] <= i]
        if active:
            hook = functools.partial(pre_hook, i, active[-1])
            handles.append(layers[i].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield
    finally:
        for hd in handles:
            hd.remove()


def hide_from_layer(model, layer: int, dropped: torch.Tensor):
    """dropped: (L,) bool over the prompt sequence, hidden from `layer` on (one stage, FastV)."""
    return hide_by_stage(model, [(layer, dropped, [])])


def reference_staged(model, inputs: dict, step_inputs, stages, max_new_tokens: int):
    """(prompt logits (L, vocab) float32, greedy token ids, margins) of the full-sequence model under
    `hide_by_stage(stages)`. inputs: the prefill kwargs of the model; step_inputs(token, step) ->
    kwargs of one decoding step. margins[i]: the gap between the best and the second-best logit at
    greedy step i (a near-tie there lets another computation of the same logits pick the other token).
    """
    from transformers import DynamicCache

    with torch.no_grad(), hide_by_stage(model, stages):
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


def reference_run(model, inputs: dict, step_inputs, layer: int, dropped: torch.Tensor, max_new_tokens: int):
    """`reference_staged` with one stage: `dropped` hidden from `layer` on."""
    return reference_staged(model, inputs, step_inputs, [(layer, dropped, [])], max_new_tokens)
