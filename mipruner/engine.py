"""One model, many browser sessions: encode once, prune and render many times, generate on demand.

`Engine` owns ONE model adapter (loaded once, shared, read-only); its forward passes (encode,
generate) run under a lock. Everything per user lives in a `Session` (one per browser session),
which holds its own small LRU cache of encodings, keyed by (model, media content hash, prompt,
text_mode, need_attention) and expiring by count and by idle age. Per encoding it also keeps the
MI cache (`cache=` of `mipruner.prune`, which makes a slider move cheap), the render `Layout`, and
the answers generated so far. Sessions share no mutable state; the engine holds no per-user state.
One `CacheBudget` (shared by every engine of an app) caps the bytes of all sessions' encodings
together, least recently used first: memory stays bounded however many sessions come and go.

The UI calls only this module: `encode -> key`, `view(key, methods, budget, ...)` for the images
of each method, `generate(key, method, ...)` for answers, and `method_specs()` / `parameters()` /
`TEXT_MODES` for what to offer (the registry's specs), so `components/` imports no pruner, model
or in-LLM module.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from PIL import Image

import mipruner
from mipruner.models.text import TEXT_MODES
from mipruner.pruners import Param, PrunerSpec, Selection, all_params, get_pruner, list_pruners, resolve_budget

from . import viz
from .export import selection_to_json
from .failures import guarded, request_errors
from .prompt_words import PromptWords, prompt_words
from .session import CacheBudget, CachedEncoding, EncodingKey, FileBudget, Session, StaleKeyError, media_hash, nbytes

DEFAULT_CACHE_BYTES = 1 << 30  # 1 GiB of cached encodings across all sessions (LLaVA-1.5: ~15 MB each)


def load_adapter(name_or_path: str, device=None, dtype=None):
    """Load a model by hub id, local directory or alias and return its adapter (`mipruner.load`)."""
    return mipruner.load(name_or_path, device=device, dtype=dtype)


def method_specs() -> list[PrunerSpec]:
    """Every registered method's spec (name, label, stage, needs, params), sorted by name."""
    return [get_pruner(n) for n in list_pruners()]


def method_spec(name: str) -> PrunerSpec:
    """The spec of method `name`; unknown names raise ValueError with "did you mean"."""
    return get_pruner(name)


def parameters() -> dict[str, Param]:
    """Every registered method parameter by name (one definition per name)."""
    return all_params()


@dataclass(frozen=True)
class MethodSpec:
    """A method to show: registry name, optional label and parameter overrides."""

    name: str
    params: dict = field(default_factory=dict, hash=False)
    label: str = ""

    def __post_init__(self):
        get_pruner(self.name)  # unknown names raise with "did you mean"

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass
class MethodView:
    """What one method panel shows after a slider move."""

    method: str
    label: str
    selection: Selection | None  # None when the method failed (`error`)
    kept: int
    share: float  # kept / N_V
    prune_ms: float
    render_ms: float
    mask: Image.Image | None
    heatmap: Image.Image | None  # PMI with `heat_token` for MI methods when given, else the method's scores
    heat_title: str
    pivot: Image.Image | None = None  # MI methods: pivot words; merging methods: `viz.merge_map`
    legend: list[tuple[str, str]] | None = None
    error: str | None = None  # one sentence when this method raised or broke the contract on this input


# ---------------------------------------------------------------------------------- the engine

def _freeze(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


class Engine:
    """Owns one adapter (or a loader called once, on first use); serves any number of sessions.

    adapter_or_loader: a `mipruner.models.Adapter`, or a zero-argument callable returning one
    (e.g. `lambda: mipruner.load(path)`), so the app can start before the model is loaded.
    clock: seconds, monotonic (tests pass a fake one to check expiry).
    cache: the byte cap over every session's encodings (share one between the engines of an app);
    default: a cap of DEFAULT_CACHE_BYTES for this engine's sessions.
    """

    def __init__(self, adapter_or_loader, *, name: str | None = None,
                 clock: Callable[[], float] = time.monotonic, session_entries: int = 3,
                 session_max_age_s: float = 1800.0, cache: CacheBudget | None = None):
        from mipruner.models.base import Adapter

        if isinstance(adapter_or_loader, Adapter):
            self._adapter, self._loader = adapter_or_loader, None
        elif callable(adapter_or_loader):
            self._adapter, self._loader = None, adapter_or_loader
        else:
            raise ValueError("Engine needs an Adapter or a zero-argument callable returning one, "
                             f"got {type(adapter_or_loader).__name__}")
        self._name = name
        self._model_lock = threading.Lock()  # one forward pass at a time through the shared model
        self._load_lock = threading.Lock()
        self.clock = clock
        self.session_entries, self.session_max_age_s = session_entries, session_max_age_s
        self.cache = cache if cache is not None else CacheBudget(DEFAULT_CACHE_BYTES)
        self._weights: frozenset | None = None

    @property
    def adapter(self):
        if self._adapter is None:
            with self._load_lock:
                if self._adapter is None:
                    self._adapter = self._loader()
        return self._adapter

    @property
    def model_name(self) -> str:
        if self._name:
            return self._name
        a = self.adapter
        return str(getattr(a, "name", "") or getattr(a, "family", "") or type(a).__name__)

    def new_session(self) -> Session:
        return Session(max_entries=self.session_entries, max_age_s=self.session_max_age_s, budget=self.cache)

    def prompt_words(self, prompt: str) -> PromptWords:
        """Which pieces of `prompt` this model cannot read (see `prompt_words`)."""
        return prompt_words(getattr(self.adapter, "tokenizer", None), prompt)

    def adopt(self, session: Session) -> None:
        """Put a session that came back from another process (unpickled: no byte cap) under this
        engine's cap again, charging each of its entries."""
        session.budget = self.cache
        for key in session.keys():
            self._account(session, key)

    def _account(self, session: Session, key: EncodingKey) -> None:
        """Report the entry's current size to the byte cap (which may drop other entries)."""
        if self._weights is None:  # the model's own tensors are shared, never charged to a session
            import torch

            mods = [m for m in vars(self.adapter).values() if isinstance(m, torch.nn.Module)]
            self._weights = frozenset(t.untyped_storage().data_ptr() for m in mods
                                      for t in itertools.chain(m.parameters(), m.buffers()))
        with session.lock:
            e = session.entries.get(key)
            size = nbytes(e, self._weights) if e is not None else 0
        if e is not None:
            (session.budget or self.cache).charge(session, key, size)

    # -- encode

    def encode(self, session: Session, media, prompt: str, text_mode: str = "question",
               need_attention: bool | None = None, methods=()) -> EncodingKey:
        """Encode (media, prompt) unless this session has it cached; returns the cache key.

        need_attention=None: True when any of `methods` (names or MethodSpecs) needs the vision
        encoder's attention. An encoding with attention also serves requests without it.
        """
        if need_attention is None:
            names = [m.name if isinstance(m, MethodSpec) else m for m in methods]
            need_attention = mipruner.needs_attention(names)
        key = EncodingKey(self.model_name, media_hash(media), prompt, text_mode, bool(need_attention))
        with session.lock:
            now = self.clock()
            session.expire(now)
            for k in (key, key._replace(need_attention=True)):
                if k in session.entries:
                    session.entries.move_to_end(k)
                    session.entries[k].last_used = now
                    (session.budget or self.cache).touch(session, k)
                    return k
        with self._model_lock:
            enc = self.adapter.encode(media, prompt, text_mode=text_mode, need_attention=bool(need_attention))
        with session.lock:
            now = self.clock()
            session.entries[key] = CachedEncoding(encoded=enc, last_used=now)
            session.entries.move_to_end(key)
            session.expire(now)
        self._account(session, key)
        return key

    def entry(self, session: Session, key: EncodingKey) -> CachedEncoding:
        """The cached encoding for `key`; StaleKeyError when it was evicted, expired or never made."""
        with session.lock:
            now = self.clock()
            session.expire(now)
            if key not in session.entries:
                raise StaleKeyError("this encoding is no longer cached (expired or evicted): encode again")
            e = session.entries[key]
            e.last_used = now
            session.entries.move_to_end(key)
        (session.budget or self.cache).touch(session, key)
        return e

    def encoded(self, session: Session, key: EncodingKey):
        return self.entry(session, key).encoded

    def layout(self, session: Session, key: EncodingKey) -> viz.Layout:
        e = self.entry(session, key)
        with session.lock:
            if e.layout is None:
                e.layout = viz.build_layout(e.encoded)
            return e.layout

    # -- prune / view

    def _prune(self, e: CachedEncoding, method: str, budget, params: dict) -> Selection:
        if get_pruner(method).stage == "llm":
            # runs the first K decoder layers once per (encoding, K), then only re-ranks
            with self._model_lock:
                return mipruner.select(self.adapter, e.encoded, method, budget, cache=e.mi_cache, strict=False,
                                       **params)
        return mipruner.select(None, e.encoded, method, budget, cache=e.mi_cache, strict=False, **params)

    def prune(self, session: Session, key: EncodingKey, method: str, budget, **params) -> Selection:
        """`mipruner.prune` on the cached encoding, with its attention/keys/seed/MI cache passed in.
        Parameters a method does not accept are ignored (one params dict serves every method)."""
        e = self.entry(session, key)
        with session.lock:
            sel = self._prune(e, method, budget, params)
        self._account(session, key)
        return sel

    def view(self, session: Session, key: EncodingKey, methods: list, budget, params: dict | None = None,
             heat_token: int | None = None) -> list[MethodView]:
        """Prune with each method and render its panel: mask, heatmap, pivot map (MI methods).

        methods: MethodSpecs or names; params: shared pruner parameters, overridden per MethodSpec;
        heat_token: a scoring-text token index for the MI methods' PMI heatmap (None: the scores).
        A method that raises or breaks the contract on this input costs only its own panel: its view
        has `error` (one sentence) and no selection or images; the other views render. A built-in's
        ValueError (settings that do not fit this input) stays the request's error (`request_errors`).
        """
        e = self.entry(session, key)
        enc = e.encoded
        lay = self.layout(session, key)
        out = []
        resolve_budget(budget, enc.n_visual)  # a bad budget is the request's error, not a method's
        with session.lock:
            for m in methods:
                spec = m if isinstance(m, MethodSpec) else MethodSpec(m)
                view, why = guarded(spec.name, lambda spec=spec: self._view_one(e, enc, lay, spec, budget, params,
                                                                                heat_token), request_errors(spec.name))
                out.append(view or MethodView(method=spec.name, label=spec.title, selection=None, kept=0, share=0.0,
                                              prune_ms=0.0, render_ms=0.0, mask=None, heatmap=None, heat_title="",
                                              error=why))
        self._account(session, key)
        return out

    def _view_one(self, e: CachedEncoding, enc, lay, spec: MethodSpec, budget, params: dict | None,
                  heat_token: int | None) -> MethodView:
        t0 = time.perf_counter()
        sel = self._prune(e, spec.name, budget, {**(params or {}), **spec.params})
        t1 = time.perf_counter()
        mask = viz.kept_mask(enc, sel, layout=lay)
        pivot = legend = None  # maps that follow the scores alone are redrawn only when they change
        if sel.pmi is not None and sel.pivot is not None:
            pivot, legend = e.drawn(("pivot", spec.title), sel.pivot, lambda: viz.pivot_map(enc, sel, layout=lay))
        elif sel.merged_into is not None:  # a merging method: which dropped patch went into which kept one
            pivot, legend = viz.merge_map(enc, sel, layout=lay)
        if heat_token is not None and sel.pmi is not None:
            heat = e.drawn(("pmi", spec.title, heat_token), sel.pmi[:, heat_token],
                           lambda: viz.pmi_heatmap(enc, sel, heat_token, layout=lay))
            title = f"PMI with {enc.scoring_tokens[heat_token]!r}"
        else:
            heat, title = e.drawn(("scores", spec.title), sel.scores,
                                  lambda: viz.scores_heatmap(enc, sel.scores, layout=lay)), f"{spec.name} scores"
        t2 = time.perf_counter()
        return MethodView(method=spec.name, label=spec.title, selection=sel, kept=sel.budget,
                          share=sel.budget / enc.n_visual, prune_ms=(t1 - t0) * 1e3,
                          render_ms=(t2 - t1) * 1e3, mask=mask, heatmap=heat, heat_title=title,
                          pivot=pivot, legend=legend)

    # -- generate

    def _answer_key(self, enc, method: str | None, budget, params: dict | None, max_new_tokens: int) -> tuple:
        if method is None:
            return (None, None, (), max_new_tokens)
        accepted = get_pruner(method).param_names
        k = resolve_budget(budget, enc.n_visual)
        used = {p: v for p, v in (params or {}).items() if p in accepted and p != "cache"}
        return (method, k, _freeze(used), max_new_tokens)

    def cached_answer(self, session: Session, key: EncodingKey, method: str | None, budget=None,
                      params: dict | None = None, max_new_tokens: int = 64):
        """The answer `generate` would return if it is already cached, else None (never runs the LLM)."""
        e = self.entry(session, key)
        akey = self._answer_key(e.encoded, method, budget, params, max_new_tokens)
        with session.lock:
            return e.answers.get(akey)

    def generate(self, session: Session, key: EncodingKey, method: str | None, budget=None,
                 params: dict | None = None, max_new_tokens: int = 64):
        """The model's answer on the kept tokens (method=None: unpruned reference), cached per
        (encoding, method, budget, the params that method accepts, max_new_tokens)."""
        e = self.entry(session, key)
        enc = e.encoded
        akey = self._answer_key(enc, method, budget, params, max_new_tokens)
        with session.lock:
            if akey in e.answers:
                return e.answers[akey]
            sel = None if method is None else self._prune(e, method, budget, params or {})
        with self._model_lock:
            ans = mipruner.answer(self.adapter, enc, sel, max_new_tokens=max_new_tokens, cache=e.mi_cache)
        with session.lock:
            e.answers[akey] = ans
        self._account(session, key)
        return ans

    @property
    def model_lock(self) -> threading.Lock:
        """Held around every forward pass through the shared model; a caller that runs the adapter
        itself (the app's sweeps) holds it for each item."""
        return self._model_lock

    def generate_many(self, session: Session, key: EncodingKey, methods: list, budget=None,
                      params: dict | None = None, max_new_tokens: int = 64) -> list:
        """The unpruned reference and each of `methods`' answers on one encoding, decoded as ONE batch
        (`mipruner.answer_batch`: pre-LLM methods' kept sets packed into one prefill; in-LLM methods
        answer one by one). methods: names or MethodSpecs; params: shared, overridden per MethodSpec,
        as in `view`. Answers already cached are reused; new ones fill the same cache as `generate`
        (so a later `generate` or `cached_answer` of any of them returns them).
        A method whose selection or answer fails costs only its own entry: the sentence (str) of its
        failure stands in its place. Returns [reference, one Answer (or sentence) per entry of `methods`]."""
        e = self.entry(session, key)
        enc = e.encoded
        specs = [m if isinstance(m, MethodSpec) else MethodSpec(m) for m in methods]
        wanted = [(None, {})] + [(s.name, {**(params or {}), **s.params}) for s in specs]
        akeys = [self._answer_key(enc, m, budget, p, max_new_tokens) for m, p in wanted]
        todo: dict = {}  # answer key -> selection, first occurrence only
        failed: dict = {}  # answer key -> the sentence of its failure (never cached: a retry may succeed)
        with session.lock:
            for (m, p), k in zip(wanted, akeys):
                if k not in e.answers and k not in todo and k not in failed:
                    sel, why = (None, None) if m is None else guarded(m, lambda m=m, p=p: self._prune(e, m, budget, p),
                                                                           request_errors(m))
                    if why is None:
                        todo[k] = sel
                    else:
                        failed[k] = why
        if todo:
            with self._model_lock:
                got, _ = guarded(None, lambda: mipruner.answer_batch(self.adapter, enc, list(todo.values()),
                                                                     max_new_tokens=max_new_tokens, cache=e.mi_cache))
                if got is None:  # one selection's answer broke the batch: each answers alone
                    got = []
                    for k, sel in todo.items():
                        ans, why = guarded(sel.method if sel is not None else None, lambda sel=sel: mipruner.answer(
                            self.adapter, enc, sel, max_new_tokens=max_new_tokens, cache=e.mi_cache))
                        got.append(ans)
                        if why is not None:
                            failed[k] = why
            with session.lock:
                e.answers.update((k, a) for k, a in zip(todo, got) if a is not None)
        with session.lock:
            return [failed[k] if k in failed else e.answers[k] for k in akeys]

    def export_json(self, session: Session, key: EncodingKey, method: str, budget, **params) -> str:
        sel = self.prune(session, key, method, budget, **params)
        return selection_to_json(self.encoded(session, key), sel)


__all__ = ["DEFAULT_CACHE_BYTES", "TEXT_MODES", "CacheBudget", "CachedEncoding", "Engine", "EncodingKey", "FileBudget",
           "MethodSpec", "MethodView", "PromptWords", "Session", "StaleKeyError", "load_adapter", "media_hash",
           "method_spec", "method_specs", "parameters", "prompt_words", "selection_to_json"]
