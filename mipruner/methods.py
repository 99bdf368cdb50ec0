"""One front door for every registered method, wherever it selects: `select` on an encoding,
`answer` on a selection.

    sel = mipruner.select(adapter, enc, "mi", 64, cache=c, lam=1.0)   # pre-LLM: from the encoding
    sel = mipruner.select(adapter, enc, "fastv", 64, cache=c)          # in-LLM: runs layers 0..K-1
    ans = mipruner.answer(adapter, enc, sel, cache=c)                  # the LLM on the kept tokens
    ref = mipruner.answer(adapter, enc, None)                          # the unpruned answer

`cache` is one caller-owned dict per encoding: the MI normalisers and the in-LLM prefix live
there, so a second budget or lambda costs only the re-ranking. The engine, the eval runner, the
benches and the lmms-eval model all go through these two functions; nothing else branches on a
method's stage.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from .measure.compute import attach_compute
from .models.base import Answer, Encoded
from .models.common.generation import GenerationConfig, processors
from .pruners._registry import MethodSpec, check_plugin_selection, get_pruner, run_pre_llm
from .pruners.batched import run_batch
from .pruners.lam_rule import resolve_lam
from .pruners.selection import Selection, resolve_budget
from .pruners.signals import Signals, encode_kwargs

_LLM_CACHE = "llm"  # the in-LLM methods share one sub-cache: the same prefix serves FastV and DART at one K


def signals_for(methods: Iterable[str]) -> Signals:
    """The encoder signals `methods` ask for together (`Signals`: blocks, per-head attention, features):
    `adapter.encode(media, prompt, **encode_kwargs(signals_for(methods)))` records all of them at once."""
    out = Signals()
    for m in methods:
        out = out | get_pruner(m).signals
    return out


def needs_attention(methods: Iterable[str]) -> bool:
    """True when any of `methods` reads the vision encoder's attention (encode with it)."""
    return signals_for(methods).attention


def encode_for(adapter, media, prompt: str, methods: Iterable[str] = (), *, text_mode: str = "question"):
    """`adapter.encode` with every signal `methods` ask for (`signals_for`), in one tower pass."""
    return adapter.encode(media, prompt, text_mode=text_mode, **encode_kwargs(signals_for(methods)))


_BLOCK_INPUTS = ("attention", "keys", "attention_heads")


def _inputs(spec: MethodSpec, encoded: Encoded, cache: dict | None, params: dict | None = None) -> dict:
    """The encoding-derived keyword inputs (attention, keys, ...) method `spec` takes; attention, keys and
    per-head attention of the encoder block it declares (`encoder_layer`); `frame_index` too when its bound
    `params` ask for per-frame budgets (`pruners/per_frame.py`)."""
    kw = {}
    names = spec.inputs
    if (params or {}).get("per_frame", "off") != "off" and "frame_index" not in names:
        names = (*names, "frame_index")
    for name in names:
        if name == "cache":
            if cache is not None:
                kw["cache"] = cache.setdefault(spec.name, {})
            continue
        if name in _BLOCK_INPUTS:
            value = encoded.signal(name, spec.encoder_layer)
        else:
            value = getattr(encoded, name, None)
        if value is None and name in spec.needs:
            block = "" if spec.encoder_layer is None else f" of block {spec.encoder_layer}"
            raise ValueError(f"{spec.name!r} needs the vision encoder's {name}{block}, which this encoding lacks: "
                             f"encode with signals=mipruner.signals_for([{spec.name!r}])")
        kw[name] = value
    return kw


def select(adapter, encoded: Encoded, method: str, budget, *, cache: dict | None = None, strict: bool = True,
           **params) -> Selection:
    """The visual tokens `method` keeps of `encoded`, as a Selection over its N_V visual tokens.

    adapter: the model that made `encoded` (needed by in-LLM methods; pre-LLM ones accept None).
    budget: int tokens in [1, N_V] or a share in (0, 1]. cache: one dict per encoding (optional).
    strict: unknown parameters raise TypeError; strict=False ignores them, so one dict of settings
    serves every method. Given an adapter with a decoder, `sel.extras["compute"]` is the selection's
    prefill compute (`mipruner.measure.compute.Compute`: FLOPs, visual-token-layers, KV bytes and their shares
    of the unpruned model's).
    Methods with a `lam_rule` parameter (the MI family) get `lam` from the paper's rule when it is
    "auto" (the default unless `lam` alone is given): 1 for a closed-form `encoded.prompt`, 0.5
    otherwise (`mipruner/pruners/lam_rule.py`); `sel.extras["lam"]` / `["lam_note"]` say which applied.

    This is an edge: the name, the parameters and the budget are checked here, once; the method's
    function gets an int budget in [1, N_V] and validated parameters.
    """
    spec = get_pruner(method)
    kw = spec.bind(params, strict=strict)
    note = None
    if "lam_rule" in spec.param_names:
        kw, note = resolve_lam(kw, encoded.prompt, spec.param("lam").default)
    if spec.stage == "llm":
        if adapter is None:
            raise ValueError(f"{method!r} selects inside the LLM: pass the adapter that made the encoding")
        k = resolve_budget(budget, encoded.n_visual)
        sub = None if cache is None else cache.setdefault(_LLM_CACHE, {})
        sel = spec.fn(adapter, encoded, k, cache=sub, **kw)
        if spec.checked:  # a plug-in's or a script's selection is checked before anything reads it
            check_plugin_selection(spec, sel, encoded.n_visual, k, encoded.visual.device)
        sel.method = method
    else:
        sel = run_pre_llm(spec, encoded.visual, encoded.scoring_text if spec.needs_text else None, budget,
                          _inputs(spec, encoded, cache, kw), kw)
    if note is not None:
        sel.extras.update(lam=kw["lam"], lam_note=note)
    # its prefill compute (`mipruner.measure.compute`), when the model has a decoder to count
    return sel if adapter is None else attach_compute(adapter, encoded, sel)


def select_batch(adapter, encodings: Sequence[Encoded], method: str, budget, *, caches: Sequence[dict] | None = None,
                 strict: bool = True, **params) -> list[Selection]:
    """`[select(adapter, e, method, budget, cache=c, ...) for e, c in zip(encodings, caches)]`, with the pre-LLM
    selections of equal-shape encodings (one model's N_V, prompts of one length, the same resolved parameters)
    run as one batched call where the method allows it (`mipruner.pruners.batched`: one `torch.vmap` call, one
    CUDA graph on CUDA). Decisions equal the one-by-one ones; scores agree within float32 rounding. In-LLM
    methods, and methods that do not declare a batched call, select one encoding at a time."""
    caches = [None] * len(encodings) if caches is None else list(caches)
    if len(caches) != len(encodings):
        raise ValueError(f"caches has {len(caches)} entries for {len(encodings)} encodings")
    spec = get_pruner(method)
    if spec.stage == "llm" or spec.capture is None or not spec.capture.batch or len(encodings) < 2:
        return [select(adapter, e, method, budget, cache=c, strict=strict, **params) for e, c in zip(encodings, caches)]
    kw = spec.bind(params, strict=strict)
    by_params: dict[tuple, list[int]] = {}
    resolved, notes = [], []
    for i, e in enumerate(encodings):
        kw_i, note = (kw, None)
        if "lam_rule" in spec.param_names:
            kw_i, note = resolve_lam(kw, e.prompt, spec.param("lam").default)
        resolved.append(kw_i)
        notes.append(note)
        by_params.setdefault(tuple(sorted((k, repr(v)) for k, v in kw_i.items())), []).append(i)
    out: list[Selection | None] = [None] * len(encodings)
    for idx in by_params.values():
        items = [{"visual": encodings[i].visual,
                  "text": encodings[i].scoring_text if spec.needs_text else None,
                  **_inputs(spec, encodings[i], caches[i], resolved[i])} for i in idx]  # a cache serves an item run alone
        for i, sel in zip(idx, run_batch(spec, items, budget, resolved[idx[0]])):
            if notes[i] is not None:
                sel.extras.update(lam=resolved[i]["lam"], lam_note=notes[i])
            out[i] = sel if adapter is None else attach_compute(adapter, encodings[i], sel)  # as `select`
    return out  # type: ignore[return-value]


def answer(adapter, encoded: Encoded, selection: Selection | None = None, *, max_new_tokens: int | None = None,
           cache: dict | None = None, config: GenerationConfig | None = None, positions: str | None = None,
           logits_processor=None, **gen) -> Answer:
    """Greedy answer of the LLM on `selection`'s kept tokens (None: all of them, the unpruned answer).
    `config`: a `GenerationConfig`, or its fields as keywords (`max_new_tokens` None: 64), checked here
    once and passed down as the object. `positions`: the LLaVA family's position rule ("compact" / "original").
    `logits_processor`: callables (generated ids, scores) -> scores, passed down beside the config (a config
    holds values only).

    In-LLM methods answer through their registered `answer` (the LLM pruned at their layer, reusing
    the prefix in `cache`; they take `max_new_tokens` and `min_new_tokens`); every other selection
    through `adapter.generate`.
    """
    config = GenerationConfig.of(max_new_tokens, config, **gen)
    procs = processors(logits_processor)
    spec = get_pruner(selection.method) if selection is not None and selection.method else None
    if spec is not None and spec.stage == "llm":
        if procs or config != GenerationConfig(**config.answer_kwargs()):
            raise ValueError(f"an in-LLM method ({selection.method}) answers with max_new_tokens and "
                             "min_new_tokens only")
        sub = None if cache is None else cache.setdefault(_LLM_CACHE, {})
        return spec.answer(adapter, encoded, selection, cache=sub, **config.answer_kwargs())
    model_kw = {} if positions is None else {"positions": positions}
    if procs:  # beside the config, only when given (an adapter written before them need not take the keyword)
        model_kw["logits_processor"] = procs
    return adapter.generate(encoded, keep=selection, config=config, **model_kw)


__all__ = ["answer", "encode_for", "needs_attention", "select", "select_batch", "signals_for"]
