"""One batch of rows decoded greedily: the grouped padded prefill (`rows.py`), the rows' caches joined
(or written into a static cache), then the one greedy loop (`common/greedy.greedy`), on the plain path or
compiled (`common/greedy.compiled`). Families call `decode` with their `rows.Rows`; nothing here knows a family.

On the compiled path every forward sees shapes from a fixed set: the prefill (rows padded to a power of
two by repeating a row, width bucketed), the step (rows padded the same way, a static cache of
`slots` = the batch's pruned width + new tokens, bucketed: sized to the PRUNED rows, not the unpruned
prompt). `shapes` lists them, and the warm-up compiles them before a request comes.
"""
from __future__ import annotations

import torch

from . import greedy as P
from . import rows as R


def static_slots(width: int, max_new_tokens: int, bucket: int) -> int:
    """The static cache's slots: the batch's (bucketed) width + new tokens, rounded up to the bucket."""
    return R.round_up(int(width) + int(max_new_tokens), max(int(bucket), 1))


@torch.no_grad()
def decode(adapter, spec: R.Rows, max_new_tokens: int, path, eos: list[int], procs: list, min_new: int = 0,
           pad: int = 0) -> tuple[list[list[int]], float]:
    """Greedy token rows of `spec`'s rows (in their order) and the time of the first token."""
    from transformers import DynamicCache

    model = adapter.model
    n_rows = len(spec.lengths)
    forward = P.compiled(adapter, "prefill", spec.prefill) if path.compile else spec.prefill
    first, caches, widths, counts, order, mask = R.prefill(model, spec, path.bucket, path.compile, forward)
    at = {row: j for j, row in enumerate(order[:n_rows])}  # a row's place in group order
    rows_out = [at[i] for i in range(n_rows)]
    rows_out += [at[0]] * (len(order) - n_rows)  # pad rows of a compiled shape repeat row 0
    identity = rows_out == list(range(len(rows_out)))
    select = None if identity else torch.tensor(rows_out, dtype=torch.long, device=first.device)
    if select is not None:
        first, mask = first.index_select(0, select), mask.index_select(0, select)
    width = int(mask.shape[1])
    slots = None
    if path.compile:  # the shapes the compiled functions run (`warm_up` compiles the fixed set of them)
        state = adapter.decode_state
        for g, w in zip(R.groups(spec.lengths, path.bucket), widths):
            state.saw("prefill", (R.batch_bucket(len(g)), w))
        state.saw("step", (len(order), static_slots(width, max_new_tokens, path.bucket) if path.static_cache else width))
    if path.static_cache:
        slots = static_slots(width, max_new_tokens, path.bucket)
        cache = R.join(caches, widths, counts, width, P.static_cache(adapter, len(order), slots), select)
    elif len(caches) == 1 and identity:
        cache = caches[0]  # one group in the rows' order: its cache as it is, as `generate` has it
    else:
        cache = R.join(caches, widths, counts, width, DynamicCache(config=model.config.get_text_config()), select)
    del caches
    next_pos = spec.next_pos if len(order) == n_rows else torch.cat(
        [spec.next_pos, spec.next_pos[:1].expand(len(order) - n_rows)])
    step_model = P.compiled(adapter, "step", model) if path.compile else model
    done = [0]

    def step(tokens, m):
        pos = spec.step_positions(next_pos + done[0])
        done[0] += 1
        out = step_model(input_ids=tokens[:, None], attention_mask=m, position_ids=pos, past_key_values=cache,
                         use_cache=True)
        return out.logits[:, -1]

    ids, t_first = P.greedy(step, first, mask, max_new_tokens, eos, procs, min_new, pad, slots)
    return ids[:n_rows], t_first


__all__ = ["decode", "static_slots"]
