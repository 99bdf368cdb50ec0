"""The decoding engine (`DecodeEngine`): handed a model and its decoding state, it decodes a batch of rows
greedily: the grouped padded prefill (`rows.py`), the rows' caches joined (or written into a static
cache), then the one greedy loop (`common/greedy.greedy`), on the plain path or compiled. Families build
their `rows.Rows` (plain data and callbacks that close over plain data) and call `decode`; nothing here
knows a family, and the engine never reaches back into an adapter.

On the compiled path every forward has a shape: the prefill (rows padded to a power of two by
repeating a row, width bucketed), the step (rows padded the same way, a static cache of `slots` = the
batch's pruned width + new tokens, bucketed: sized to the PRUNED rows, not the unpruned prompt). A shape
in the declared set (`state.Buckets`, which `mipruner.serve.warm_up` declares and compiles before a request
comes) runs its own compiled function; any other shape runs eagerly and is counted (`DecodeState.eager`),
so no request compiles. Each shape's compiled function is compiled from its own code object, so dynamo's
per-function recompile limit is never reached (and never raised).
"""
from __future__ import annotations

import types

import torch

from . import greedy as P
from . import rows as R
from .generation import GenerationConfig
from .path import DecodePath
from .state import DecodeState, static_slots

COMPILE = {"dynamic": False}  # torch.compile arguments of the compiled prefill, step and tower (tests set a backend)
STATIC_CACHES = 3  # static caches kept per model: the app's view (B rows), its slider move (B - 1), one answer


def _forward(model, **kw):
    """A decoding step's forward (`DecodeEngine.step`): one code object copied per compiled shape."""
    return model(**kw)


def _fresh(fn):
    """`fn` (a plain function) with its own code object: dynamo keeps its compiled graphs per code
    object, so each shape's compiled function counts alone against `recompile_limit`."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class DecodeEngine:
    """The decoding engine of one model. model: the transformers model; state: its `DecodeState`
    (compiled functions, static caches, declared buckets). Built by `Adapter.decoder`."""

    def __init__(self, model, state: DecodeState):
        self.model = model
        self.state = state
        self.device = model.device

    # -- compiled functions and static caches -------------------------------------------------------

    def compiled(self, name: str, fn, shape: tuple, path_compile: bool = True):
        """The function to run for a forward of `name` at `shape`: `fn` itself on the plain path, off
        CUDA unless COMPILE names a backend (as `generate` compiles nothing there), or when `shape` is
        outside the declared buckets (counted in `state.eager`); else `torch.compile(fn, **COMPILE)` of
        that shape (on CUDA mode "reduce-overhead": CUDA graphs), made once and kept in the state."""
        if not path_compile or (self.device.type != "cuda" and "backend" not in COMPILE):
            return fn
        shape = tuple(int(s) for s in shape)
        if not self.state.allows(name, shape):
            self.state.eager[name] += 1
            return fn
        key = (name, shape)
        held = self.state.compiled.get(key)
        if held is None or held[0] is not self.model:
            kw = dict(COMPILE)
            if self.device.type == "cuda" and "backend" not in kw:
                kw.setdefault("mode", "reduce-overhead")
            held = (self.model, torch.compile(_fresh(fn), **kw))
            self.state.compiled[key] = held
        self.state.saw(name, shape)
        return held[1]

    def static_cache(self, batch: int, length: int):
        """A StaticCache of `length` slots for `batch` rows, kept in the state and reset when its shape
        comes again, so that a compiled step sees the same buffers (a CUDA graph is recorded for buffers:
        new ones would record it again). The last STATIC_CACHES shapes are kept (least recently used
        dropped): the app alternates between a view's rows and a slider move's rows, each reusing its own."""
        from transformers import StaticCache

        held = self.state.caches
        key = (int(batch), int(length))
        cache = held.pop(key, None)
        if cache is not None:
            cache.reset()
        else:
            cache = StaticCache(config=self.model.config.get_text_config(), max_cache_len=length)
            while len(held) >= STATIC_CACHES:
                held.popitem(last=False)
        held[key] = cache  # the most recently used last
        return cache

    # -- decoding -----------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, spec: R.Rows, config: GenerationConfig, path: DecodePath,
               procs: tuple = ()) -> tuple[list[list[int]], float]:
        """Greedy token rows of `spec`'s rows (in their order) and the time of the first token. `config`:
        resolved (`GenerationConfig.resolve`: concrete EOS and pad ids); `procs`: the logits processors beside it."""
        from transformers import DynamicCache

        model, n_rows, new = self.model, len(spec.lengths), config.max_new_tokens

        def prefill(m, inputs):
            x = inputs["attention_mask"]
            return self.compiled("prefill", spec.prefill, tuple(x.shape), path.compile)(m, inputs)

        first, caches, widths, counts, order, mask = R.prefill(model, spec, path.bucket, path.compile, prefill)
        at = {row: j for j, row in enumerate(order[:n_rows])}  # a row's place in group order
        rows_out = [at[i] for i in range(n_rows)]
        rows_out += [at[0]] * (len(order) - n_rows)  # pad rows of a compiled shape repeat row 0
        identity = rows_out == list(range(len(rows_out)))
        select = None if identity else torch.tensor(rows_out, dtype=torch.long, device=first.device)
        if select is not None:
            first, mask = first.index_select(0, select), mask.index_select(0, select)
        width = int(mask.shape[1])
        slots = None
        if path.static_cache:
            slots = static_slots(width, new, path.bucket)
            cache = R.join(caches, widths, counts, width, self.static_cache(len(order), slots), select)
        elif len(caches) == 1 and identity:
            cache = caches[0]  # one group in the rows' order: its cache as it is, as `generate` has it
        else:
            cache = R.join(caches, widths, counts, width, DynamicCache(config=model.config.get_text_config()), select)
        del caches
        next_pos = spec.next_pos if len(order) == n_rows else torch.cat(
            [spec.next_pos, spec.next_pos[:1].expand(len(order) - n_rows)])
        # a step has one shape only over a static cache; a growing dynamic cache's step runs eagerly
        forward = (self.compiled("step", _forward, (len(order), slots), path.compile) if slots is not None
                   and new > 1 else _forward)
        done = [0]

        def step(tokens, m):
            pos = spec.step_positions(next_pos + done[0])
            done[0] += 1
            out = forward(model, input_ids=tokens[:, None], attention_mask=m, position_ids=pos, past_key_values=cache,
                          use_cache=True)
            return out.logits[:, -1]

        ids, t_first = P.greedy(step, first, mask, new, config.eos, list(procs),
                                config.min_new_tokens, config.pad_token_id, slots)
        return ids[:n_rows], t_first


__all__ = ["COMPILE", "STATIC_CACHES", "DecodeEngine", "static_slots"]
