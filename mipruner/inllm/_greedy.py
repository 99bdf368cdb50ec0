"""Greedy decoding after an in-LLM method's pruned prefill (`_decoder`'s layer groups), in the decoding
engine's one loop (`models.common.greedy.greedy`), with a method's decode-time stage (`_decode_stage`) run
at every step between its layer's two groups.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..models.common.greedy import greedy as engine_greedy
from ._decode_stage import DecodeRun
from ._decoder import Prefix, Stage, apply_stage, continue_prefix, logits_of, run_layers
from ._prompt import Prompt


def greedy(prompt: Prompt, prefix: Prefix, cache, rows: torch.Tensor | None, keep: torch.Tensor | None,
           max_new_tokens: int, min_new_tokens: int = 0, on_first: Callable[[], None] | None = None,
           decode=None, attended: list | None = None) -> list[int]:
    """Greedy decoding after the pruned prefill. `cache` holds the prefix's layers (< K) already.

    rows: the rows kept from layer K on (FastV), or None for a staged prefix (`run_staged`).
    decode: a decode-time stage (`api.DecodeStage`) run at every step in this one loop; `attended`
    (a list) receives the number of visual keys the layers from its layer on attended at each step."""
    embed = prompt.lm.embed_tokens
    if rows is not None:
        prefix = apply_stage(prompt, prefix, Stage(prefix.layer, rows))
    h = continue_prefix(prompt, prefix, None, None, cache)
    logits = logits_of(prompt, h, last_only=True)[0, -1]
    eos = list(prompt.eos)
    # layer groups between stages: each group's masks are sized against its own cache length; a
    # renumbering stage's group decodes at the unpruned position minus the rows it dropped
    bounds = sorted({0, prompt.n_layers, *(st.layer for st in prefix.stages),
                     *((decode.layer,) if decode is not None else ())})
    groups = [range(a, b) for a, b in zip(bounds, bounds[1:])]
    last_at = [max([st for st in prefix.stages if st.layer <= g.start], key=lambda st: st.layer, default=None)
               for g in groups]
    shifts = [prompt.length - int(st.rows.numel()) if st is not None and st.renumber else 0 for st in last_at]
    dyn = DecodeRun(prompt, prefix.stages, decode) if decode is not None else None

    done = [0]

    def step(tokens: torch.Tensor, _mask) -> torch.Tensor:  # one token through the layer groups: (1, V)
        done[0] += 1
        x = embed(tokens[:, None])  # (1, 1, d)
        inputs: dict[int, tuple] = {}
        for group, shift in zip(groups, shifts):
            if shift not in inputs:
                rope, layer_pos = prompt.step_positions(prompt.next_position + done[0] - 1 - shift)
                inputs[shift] = (prompt.lm.rotary_emb(x, rope), layer_pos)
            pe, layer_pos = inputs[shift]
            key_mask = None
            if dyn is not None:
                if group.start == dyn.layer:
                    dyn.choose(done[0], cache)
                key_mask = dyn.key_mask(prompt, prefix.stages, group, done[0])
            x = run_layers(prompt, x, group, pe, layer_pos, cache, key_mask=key_mask)
        return logits_of(prompt, x, last_only=True)[0, -1][None]

    # the decoding engine's one greedy loop (EOS masked below min_new_tokens, stop at EOS)
    if dyn is not None:
        dyn.open()
    try:
        ids, _ = engine_greedy(step, logits[None], None, max_new_tokens, eos, [], min_new_tokens, on_first=on_first)
    finally:
        if dyn is not None:
            dyn.close()
    if dyn is not None and attended is not None and dyn.attended:
        attended.extend(torch.stack(dyn.attended).tolist())  # one transfer after the loop
    return ids[0]


__all__ = ["greedy"]
