"""The machinery of the in-LLM methods: the first K decoder layers on the full prompt (run once per
(encoding, K) and cached), then the answer or the prefill logits with the kept visual tokens only.

`prepare` is what every in-LLM method's selection starts with; `answer` is their registered
answer function (`PrunerSpec.answer`); `generate` / `prefill_logits` take the layer explicitly.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from ..models.base import Answer, Encoded, keep_indices
from ..pruners.selection import Selection


def _int(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return v


def _get_prompt(adapter, encoded: Encoded, cache: dict | None):
    from ._prompt import prompt_of

    if cache is None:
        return prompt_of(adapter, encoded)
    owner = cache.setdefault("_encoded", encoded)
    if owner is not encoded:
        raise ValueError("cache= belongs to another encoding; use one dict per encoding")
    if "prompt" not in cache:
        cache["prompt"] = prompt_of(adapter, encoded)
    return cache["prompt"]


def _layer(prompt, layer) -> int:
    return _int("layer", layer, 1, prompt.n_layers)


def _prefix(prompt, layer: int, cache: dict | None):
    """Layers 0..K-1 on the full prompt with a KV cache and every row's attention input at layer
    K-1 (what a `StageView` reads); cached per (encoding, K), shared by every in-LLM method."""
    from transformers import DynamicCache

    from ._decoder import advance, start

    key = ("walk", layer)
    if cache is not None and key in cache:
        return cache[key]
    prefix = advance(prompt, start(prompt), layer, cache=DynamicCache(config=prompt.lm.config), probe="all")
    if cache is not None:
        cache[key] = prefix
    return prefix


def prepare(adapter, encoded: Encoded, budget, layer, cache: dict | None):
    """(prompt, K, k, prefix): the unpruned prompt, the checked layer K, the budget in tokens (`budget`,
    an int in [1, N_V] that `mipruner.select` resolved) and layers 0..K-1 run on the full prompt
    (cached in `cache` per (encoding, K))."""
    prompt = _get_prompt(adapter, encoded, cache)
    layer = _layer(prompt, layer)
    k = budget  # an int in [1, N_V]: mipruner.select resolved it
    return prompt, layer, k, _prefix(prompt, layer, cache)


def answer(adapter, encoded: Encoded, selection: Selection, *, max_new_tokens: int = 64,
           cache: dict | None = None, min_new_tokens: int = 0) -> Answer:
    """The answer on an in-LLM method's selection: its stages (`extras["stages"]`) replayed, or
    pruned at `extras["layer"]` when it has none."""
    return generate(adapter, encoded, selection, layer=selection.extras.get("layer"), max_new_tokens=max_new_tokens,
                    cache=cache, min_new_tokens=min_new_tokens)


def _same_stages(a, b) -> bool:
    def same(x, y):
        return (x is None) == (y is None) and (x is None or torch.equal(x, y.to(x.device)))

    return len(a) == len(b) and all(
        s.layer == t.layer and s.renumber == t.renumber and same(s.rows, t.rows) and same(s.merge_rows, t.merge_rows)
        and same(s.merge_members, t.merge_members) and same(s.merge_of, t.merge_of) for s, t in zip(a, b))


def staged_prefix(prompt, stages, cache: dict | None):
    """(prefix after the last stage, KV cache holding the layers before it) for `stages`: the latest
    selection's (in `cache`) when they are its stages; the shared first layers of a one-stage
    schedule; else the stages replayed from the prompt."""
    from transformers import DynamicCache

    from ._decoder import apply_stage, prefill_cache, run_staged

    hit = None if cache is None else cache.get("_staged_last")
    if hit is not None and _same_stages(hit[0], stages):
        return hit[1], prefill_cache(prompt, hit[1])
    first = None if cache is None or len(stages) != 1 else cache.get(("walk", stages[0].layer))
    if first is not None:
        return apply_stage(prompt, first, stages[0]), prefill_cache(prompt, first)
    kv = DynamicCache(config=prompt.lm.config)
    return run_staged(prompt, stages, cache=kv), kv


@torch.no_grad()
def staged_prefill_logits(adapter, encoded: Encoded, selection: Selection) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward pruned as `selection`'s stages say."""
    from ._decoder import continue_prefix, logits_of, run_staged

    stages = selection.extras.get("stages")
    if stages is None or (not stages and selection.extras.get("decode") is None):
        raise ValueError("not a staged in-LLM selection (its extras lack the stages)")
    prompt = _get_prompt(adapter, encoded, None)
    prefix = run_staged(prompt, stages)
    return logits_of(prompt, continue_prefix(prompt, prefix, None))[0].float().cpu()


def _keep(encoded: Encoded, keep):
    if isinstance(keep, Selection) and keep.tokens is not None:
        raise ValueError("keep carries merged tokens (Selection.tokens, e.g. VisionZip); in-LLM pruning keeps "
                         "visual tokens by index only: pass keep=selection.keep to drop the merge")
    idx = keep_indices(keep, encoded.n_visual)
    return None if idx is None or idx.numel() == encoded.n_visual else idx


@torch.no_grad()
def prefill_logits(adapter, encoded: Encoded, keep, *, layer: int) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward over the prompt pruned at layer K.

    Rows: the prompt positions that remain after layer K, in prompt order: every non-visual
    token and the kept visual tokens (L' = L - (N_V - K)), i.e. the same rows as
    `adapter.prefill_logits(encoded, keep)`. keep=None (or every index) gives exactly
    `adapter.prefill_logits(encoded)`.
    """
    from ._decoder import continue_prefix, logits_of, run_prefix

    prompt = _get_prompt(adapter, encoded, None)
    layer = _layer(prompt, layer)
    idx = _keep(encoded, keep)
    prefix = run_prefix(prompt, layer)  # no KV cache, like the adapters' prefill
    rows = prompt.kept_sequence(idx)
    h = continue_prefix(prompt, prefix, rows, idx)
    return logits_of(prompt, h)[0].float().cpu()


class Started(NamedTuple):
    """What an in-LLM answer has before its first new token: the layers run so far (`prefix`, `kv`),
    the prompt rows and kept visual indices the remaining layers take (None: the prefix's own), and
    the counts its `Answer` reports."""
    prefix: object
    kv: object
    rows: torch.Tensor | None
    idx: torch.Tensor | None
    input_tokens: int
    visual_tokens: int


def timed_greedy(adapter, encoded: Encoded, cache: dict | None, max_new_tokens, min_new_tokens,
                 run_layers: Callable[[object], Started], decode=None) -> Answer:
    """The greedy answer every in-LLM method gives, timed one way: `run_layers(prompt)` runs (or reuses)
    the pruned layers, then the rest decode. prefill_s: from the call to the first new token (the
    prompt and `run_layers` included); decode_s: the rest (CUDA synchronised at both marks)."""
    from ._greedy import greedy

    max_new_tokens = _int("max_new_tokens", max_new_tokens, 1)
    min_new_tokens = _int("min_new_tokens", min_new_tokens, 0, max_new_tokens)
    sync = _sync_fn(adapter)
    sync()
    t0 = time.perf_counter()
    prompt = _get_prompt(adapter, encoded, cache)
    if prompt.max_positions and prompt.next_position + max_new_tokens > prompt.max_positions:
        raise ValueError(f"prompt ({prompt.next_position} positions) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's context {prompt.max_positions}")
    run = run_layers(prompt)
    first: list[float] = []

    def on_first():
        sync()
        first.append(time.perf_counter())

    attended: list[int] = []
    ids = greedy(prompt, run.prefix, run.kv, run.rows, run.idx, max_new_tokens, min_new_tokens, on_first,
                 decode=decode, attended=attended)
    sync()
    t2 = time.perf_counter()
    kw = dict(text=adapter.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
              input_tokens=run.input_tokens, visual_tokens=run.visual_tokens, prefill_s=first[0] - t0,
              decode_s=t2 - first[0])
    if decode is None:
        return Answer(**kw)
    return DecodeAnswer(**kw, decode_layer=int(decode.layer), decode_visual=tuple(attended))


@dataclass
class DecodeAnswer(Answer):
    """The answer of a method with a decode-time stage: as `Answer`, and `decode_visual`, the visual
    keys the layers from `decode_layer` on attended at each decoding step (one per generated token
    after the first), what `mipruner.measure.compute.decode_compute` counts."""

    decode_layer: int = 0
    decode_visual: tuple = ()


@torch.no_grad()
def generate(adapter, encoded: Encoded, keep, *, layer: int | None, max_new_tokens: int = 64,
             cache: dict | None = None, min_new_tokens: int = 0) -> Answer:
    """Greedy answer with the visual tokens pruned at layer K (KV cache: full below K, kept above).

    input_tokens = L' (the prompt length after layer K), visual_tokens = kept count. prefill_s:
    from the call to the first token (the first K layers included unless `cache` already holds
    them from `select`); decode_s: the rest. cache: the dict given to `select` for this encoding
    (optional): its layers 0..K-1 are reused, as FastV computes them once. min_new_tokens: EOS is
    masked before that many tokens (fixed-length benchmarks). keep=None (or every index) gives
    the same tokens as `adapter.generate(encoded)`. A staged selection (`extras["stages"]`, every
    method of `mipruner.inllm.register_inllm`) is pruned as its stages say (`layer` is not read).
    """
    stages = keep.extras.get("stages") if isinstance(keep, Selection) else None
    decode = keep.extras.get("decode") if isinstance(keep, Selection) else None
    if stages or decode is not None:
        def run_stages(prompt) -> Started:
            prefix, kv = staged_prefix(prompt, stages, cache)
            n_rows = prompt.length if prefix.rows is None else int(prefix.rows.numel())
            return Started(prefix, kv, None, None, n_rows, n_rows - (prompt.length - encoded.n_visual))

        return timed_greedy(adapter, encoded, cache, max_new_tokens, min_new_tokens, run_stages, decode)

    def run_layers(prompt) -> Started:
        from transformers import DynamicCache

        from ._decoder import prefill_cache, run_prefix

        k = _layer(prompt, layer)
        idx = _keep(encoded, keep)
        if cache is not None:
            prefix = _prefix(prompt, k, cache)
            kv = prefill_cache(prompt, prefix)
        else:
            kv = DynamicCache(config=prompt.lm.config)
            prefix = run_prefix(prompt, k, cache=kv)
        rows = prompt.kept_sequence(idx)
        n_vis = encoded.n_visual if idx is None else int(idx.numel())
        return Started(prefix, kv, rows, idx, int(rows.numel()), n_vis)

    return timed_greedy(adapter, encoded, cache, max_new_tokens, min_new_tokens, run_layers)


def _sync_fn(adapter):
    model = getattr(adapter, "model", None)
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


__all__ = ["DecodeAnswer", "answer", "generate", "prefill_logits", "prepare", "staged_prefill_logits", "timed_greedy", "Started"]
