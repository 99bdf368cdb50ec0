"""Batched answers: several selections of one encoding (or several items) decoded as one batch.

    sels = [mipruner.select(adapter, enc, m, 64, cache=c) for m in ("mi", "random", "similarity")]
    ref, *answers = mipruner.answer_batch(adapter, enc, [None, *sels], cache=c)   # one batch

The kept sets differ in length: each row is the prompt its unbatched answer sees (the same
`inputs_embeds` / `input_ids`, the same explicit positions: LLaVA "compact" / "original", Qwen's
M-RoPE positions gathered per row and its decoding start per row, Qwen3-VL's deepstack rows per
row), left-padded to the longest with masked pad columns (`mipruner/models/common/embeds_rows.py`,
`qwen/batch.py`). Greedy tokens equal the one-by-one answers except where two logits of a step
are within float rounding of each other (a batched, masked forward is not bit-identical to an
unbatched one); tests/models/test_batch_*.py assert equality at every step whose one-by-one top-2
logit margin exceeds 1e-4.

Falls back to one-by-one `mipruner.answer`:
  * in-LLM selections (stage "llm": FastV, DART) answer through their own layer loop, which prunes
    at layer K and reuses the per-encoding prefix in `cache`; batching them would need one padded
    prefix per kept set inside that loop, so each answers alone (the pre-LLM rows still batch);
  * adapters whose `abilities` declare no batched decoder (`Abilities.batch_decoding` False, e.g. the
    dummy adapter): declared per class, never probed.

Generation options: `max_new_tokens` and the rest, or one `GenerationConfig` (`config=`), checked once
here and passed down as that object; `logits_processor=` (callables) passed down beside it.

The prefill runs the rows as padded batches grouped by length (`mipruner/models/common/rows.py`): one
view's six answers make the LLM process the rows' own lengths, with no mask over the whole batch.

Encoding: `encode_items` encodes several items with one vision-tower call per `batch` items where
the family batches its tower (`adapter.encode_batch`): LLaVA-1.5, one image per item (its fixed-size
tower input); Qwen2/2.5/3-VL, one image per item at its own native resolution (the ViT takes images
of any sizes as one patch sequence), when the encoding records nothing of the tower. Other inputs
(LLaVA-NeXT's tiles per aspect ratio, OneVision's and InternVL's tiles, videos, several images) are
encoded one by one. `answer_items` batches the LLM over items.
"""
from __future__ import annotations

from typing import Sequence

from ..methods import answer
from ..models.base import Answer, Encoded
from ..models.common.generation import GenerationConfig, processors
from ..pruners._registry import get_pruner
from ..pruners.selection import Selection
from ..pruners.signals import Signals, encode_kwargs
from .answer_time import split_batch
from .failures import guarded

MAX_BATCH = 32  # rows per forward: more are split into several batches


def _batches(adapter) -> bool:
    """Whether the adapter declares a batched decoder (`Adapter.abilities`)."""
    return adapter.abilities.batch_decoding


def _in_llm(selection: Selection | None) -> bool:
    return isinstance(selection, Selection) and bool(selection.method) and get_pruner(selection.method).stage == "llm"


def _model_kw(positions: str | None, procs: tuple = ()) -> dict:
    """The keywords an answer passes on beside its config, each only when given (`positions`: the LLaVA
    family's; `logits_processor`: the callables)."""
    return {**({} if positions is None else {"positions": positions}), **({"logits_processor": procs} if procs else {})}


def _one(adapter, encoded: Encoded, selection, config: GenerationConfig, cache: dict | None,
         positions: str | None = None, procs: tuple = ()) -> Answer:
    if selection is None or isinstance(selection, Selection):
        return answer(adapter, encoded, selection, cache=cache, config=config, **_model_kw(positions, procs))
    return adapter.generate(encoded, keep=selection, config=config, **_model_kw(positions, procs))  # kept indices


def _batched(adapter, rows: list[tuple[Encoded, Selection | None]], config: GenerationConfig,
             max_batch: int, positions: str | None = None, procs: tuple = ()) -> list[Answer]:
    out: list[Answer] = []
    for i in range(0, len(rows), max(1, int(max_batch))):
        got = adapter.generate_batch(rows[i:i + max(1, int(max_batch))], config=config, **_model_kw(positions, procs))
        out += split_batch(adapter, got)  # each answer's share of the batch's prefill (mipruner.serve.answer_time)
    return out


def answer_batch(adapter, encoded: Encoded, selections: Sequence[Selection | None], *,
                 max_new_tokens: int | None = None, cache: dict | None = None, max_batch: int = MAX_BATCH,
                 config: GenerationConfig | None = None, positions: str | None = None, logits_processor=None,
                 **gen) -> list[Answer]:
    """The answers of `selections` (None: the unpruned answer; a Selection, or kept indices as
    `adapter.generate` takes them) of ONE encoding, in their order.

    Pre-LLM selections decode together, `max_batch` rows per forward; in-LLM ones and adapters
    without `generate_batch` answer one by one through `mipruner.answer` (module docstring).
    `cache`: the encoding's dict, as for `mipruner.answer`. `config` or `gen`: what `adapter.generate`
    accepts (a `GenerationConfig` or its fields; greedy only); `positions`: the LLaVA family's position rule;
    `logits_processor`: callables beside the config, as `mipruner.answer` takes them.
    """
    config = GenerationConfig.of(max_new_tokens, config, **gen)
    procs = processors(logits_processor)
    selections = list(selections)
    answers: list[Answer | None] = [None] * len(selections)
    batchable = [i for i, s in enumerate(selections) if not _in_llm(s)] if _batches(adapter) else []
    if batchable:
        got = _batched(adapter, [(encoded, selections[i]) for i in batchable], config, max_batch, positions, procs)
        for i, a in zip(batchable, got):
            answers[i] = a
    for i, s in enumerate(selections):
        if answers[i] is None:
            answers[i] = _one(adapter, encoded, s, config, cache, positions, procs)
    return answers


def answer_batch_guarded(adapter, encoded: Encoded, selections: Sequence[Selection | None], *,
                         max_new_tokens: int | None = None, cache: dict | None = None, batch: bool = True,
                         config: GenerationConfig | None = None) -> tuple[list[Answer | None], list[str | None]]:
    """(answers, sentences) of `selections` as `answer_batch` gives them; when the batch raises (or
    batch=False) each selection answers alone, and one whose answer fails gets None and the sentence of
    its failure (`mipruner.serve.failures`): a broken method costs only its own answer. A bad generation
    option raises here, before anything runs."""
    config = GenerationConfig.of(max_new_tokens, config)
    selections = list(selections)
    if batch:
        got, _ = guarded(None, lambda: answer_batch(adapter, encoded, selections, cache=cache, config=config))
        if got is not None:
            return got, [None] * len(selections)
    out = [guarded(getattr(s, "method", None) or None, lambda s=s: answer(
        adapter, encoded, s, cache=cache, config=config)) for s in selections]
    return [a for a, _ in out], [why for _, why in out]


def answer_items(adapter, rows: Sequence[tuple[Encoded, Selection | None]], *, max_new_tokens: int | None = None,
                 max_batch: int = MAX_BATCH, config: GenerationConfig | None = None, logits_processor=None,
                 **gen) -> list[Answer]:
    """The answers of several (encoding, selection) rows, e.g. one selection per item of a batch of
    items, as batches of `max_batch` rows. In-LLM selections answer one by one (no shared cache)."""
    config = GenerationConfig.of(max_new_tokens, config, **gen)
    procs = processors(logits_processor)
    rows = list(rows)
    answers: list[Answer | None] = [None] * len(rows)
    batchable = [i for i, (_, s) in enumerate(rows) if not _in_llm(s)] if _batches(adapter) else []
    if batchable:
        for i, a in zip(batchable, _batched(adapter, [rows[i] for i in batchable], config, max_batch, procs=procs)):
            answers[i] = a
    for i, (enc, s) in enumerate(rows):
        if answers[i] is None:
            answers[i] = _one(adapter, enc, s, config, None, procs=procs)
    return answers


def encode_items(adapter, items: Sequence[tuple], *, batch: int = MAX_BATCH, text_mode: str = "question",
                 need_attention: bool = False, signals: Signals | None = None) -> list[Encoded]:
    """`adapter.encode` of each (media, prompt) item, in order, `batch` items per vision-tower call where
    the adapter batches its tower (`encode_batch`), else one by one (module docstring). signals: what
    more of the encoder to record (`mipruner.signals_for(methods)`)."""
    items = list(items)
    kw = encode_kwargs(Signals.of(need_attention, signals))
    if not adapter.abilities.batch_encoding:
        return [adapter.encode(m, p, text_mode=text_mode, **kw) for m, p in items]
    step = max(1, int(batch))
    out: list[Encoded] = []
    for i in range(0, len(items), step):
        out += adapter.encode_batch(items[i:i + step], text_mode=text_mode, **kw)
    return out


def use_decode_path(adapter, *, bucket: int = 0, static_cache: bool = False, compile: bool = False, buckets=None):
    """Choose the adapter's decoding path (`Adapter.use_decode_path`, kept in its `decode_state`;
    `mipruner/models/common/path.py`): all zero/False is the plain path (the default); e.g. `bucket=64,
    static_cache=True` for the GPU path; `buckets`: the declared shapes the compiled path compiles
    (`mipruner.models.common.state.Buckets`; others run eagerly; None: each on first use). Returns the adapter."""
    return adapter.use_decode_path(bucket=bucket, static_cache=static_cache, compile=compile, buckets=buckets)

__all__ = ["MAX_BATCH", "answer_batch", "answer_batch_guarded", "answer_items", "encode_items", "use_decode_path"]
