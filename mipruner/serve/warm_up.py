"""Compile a decoding path for every shape a request can take, before a visitor asks (the app's warm-up).

On the compiled path (`DecodePath(bucket, static_cache, compile)`) the engine's forwards see shapes from
a fixed set (`mipruner/models/common/decode.py`): the prefill (rows padded to a power of two, width a
multiple of the bucket) and the step (the batch's rows padded the same way, a static cache of the batch's
width + new tokens, bucketed). `warm_up` answers, on its own encoding of (media, prompt), first the
batches of a first view (the unpruned answer with the methods' answers at `budget`, the methods alone:
a slider move, one unpruned answer; in-LLM methods never answer in a batch and are left out), then one
batch per shape of the fixed set (`buckets`): for every row count up to the view's (powers of two) and
every width bucket up to the example's unpruned prompt plus one bucket, rows of that many kept tokens.
These shapes are declared first (`Buckets.grid`: prefill (rows, width), step (rows, static-cache slots
at the warm-up's answer length), the tower at one image); each compiles (and on CUDA records its graph)
here instead of in a visitor's request. The declared set is then narrowed to what did compile, and only
then is the adapter switched to the path, so requests answered meanwhile run on its current path. After
that, a forward of any other shape (more rows, a longer prompt, another answer length) runs eagerly:
no request compiles.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from ..methods import encode_for, select
from ..pruners import get_pruner

FILLER = " Please answer in one short sentence."  # appended to reach the widths above the example's prompt


def buckets(rows: int, full: int, bucket: int) -> tuple[list[int], list[int]]:
    """(row counts, widths) the warm-up compiles: powers of two up to `rows`' bucket, and the multiples
    of `bucket` up to the unpruned prompt `full` rounded up plus one bucket."""
    from ..models.common.rows import batch_bucket, round_up

    counts = sorted({batch_bucket(n) for n in range(1, int(rows) + 1)})
    top = round_up(int(full), bucket) + bucket
    return counts, list(range(bucket, top + 1, bucket))


def _width_rows(adapter, media, prompt: str, methods, width: int, bucket: int, encs: list):
    """(encoding, kept count) whose pruned prompt falls in `width`'s bucket, or None when no row can:
    from the encodings made so far, else one of (media, prompt + FILLER x m) made longer."""
    for _ in range(4):
        for e in encs:
            text = e.prompt_tokens - e.n_visual
            k = width - text
            if 1 <= k <= e.n_visual and width - bucket < text + k:
                return e, k
        longest = max(encs, key=lambda e: e.prompt_tokens)
        if longest.prompt_tokens >= width:
            return None
        encs.append(encode_for(adapter, media, longest.prompt + FILLER * max(1, bucket // 8), methods))
    return None


def warm_up(adapter, lock: threading.Lock, media, prompt: str, methods, budget, max_new_tokens: int,
            on_batch: Callable[[int, int, str], None] | None = None, **path) -> int:
    """Answer the first view's batches and one batch per shape of the fixed set on `DecodePath(**path)`,
    each under `lock`, then switch `adapter` to it with the shapes compiled as its declared buckets.
    `on_batch(i, n, what)` before each batch. Returns the number of batches; what fails raises with the
    adapter's path unchanged."""
    from .batch import use_decode_path
    from ..models.common.path import DecodePath
    from ..models.common.state import Buckets

    target = DecodePath(**path)
    with lock:
        enc = encode_for(adapter, media, prompt, methods)
    sels = [select(adapter, enc, m, budget, strict=False) for m in methods if get_pruner(m).stage != "llm"]
    batches = [(w, [(enc, s) for s in r]) for w, r in ((f"the default view's {len(sels) + 1} answers", [None, *sels]),
                                                        (f"a slider move's {len(sels)} answers", sels),
                                                        ("one unpruned answer", [None])) if r]
    plan = None
    if target.compile and target.bucket:
        counts, widths = buckets(len(sels) + 1, enc.prompt_tokens, target.bucket)
        plan = Buckets.grid(counts, widths, [max_new_tokens], target.bucket)
        encs = [enc]
        for w in widths:
            with lock:
                found = _width_rows(adapter, media, prompt, methods, w, target.bucket, encs)
            if found is None:
                continue
            e, k = found
            keep = torch.arange(k, device=e.visual.device)
            batches += [(f"{n} rows of width {w}", [(e, keep)] * n) for n in counts]
    state = adapter.decode_state
    before = (state.path, state.buckets)
    try:
        with lock:
            state.declare(plan)  # requests meanwhile answer on the current path
        for i, (what, rows) in enumerate(batches):
            if on_batch is not None:
                on_batch(i, len(batches), what)
            with lock:
                adapter.generate_batch(rows, max_new_tokens=max_new_tokens, path=target)
        with lock:
            if target.compile:
                state.choose(**path, buckets=plan)
                adapter.encode(media, prompt)  # an encoding that records nothing: the tower's compiled shape too
            use_decode_path(adapter, **path, buckets=None if plan is None else plan.narrowed(state.shapes))
    except BaseException:
        with lock:
            p = before[0]
            state.choose(bucket=p.bucket, static_cache=p.static_cache, compile=p.compile, buckets=before[1])
        raise
    return len(batches)


__all__ = ["buckets", "warm_up"]
