"""One model, many browser sessions: encode once, prune and render many times, generate on demand.

`ModelService` owns ONE model adapter (loaded once, shared, read-only); its forward passes (encode, generate) hold its one
slot, which sessions take in turns (`turns.Turns`: round robin, `max_waiting` waiting per session; a file is decoded
before, outside it). Everything per user lives in a `Session` (one per browser session), which holds its own small LRU
cache of encodings, keyed by (model, media content hash, prompt, text_mode, need_attention, views) and expiring by
count and by idle age. Per encoding it also keeps the MI cache (`cache=` of `mipruner.prune`, which makes a slider
move cheap), the render `Layout`, and the answers generated so far (`session.py` keeps that bookkeeping: expiry, LRU
order, the byte cap). Sessions share no mutable state; the service holds no per-user state. One `CacheBudget` (shared
by every service of an app) caps the bytes of all sessions' encodings together, least recently used first: memory stays
bounded however many sessions come and go.

The UI calls only this module: `encode -> key`, `view(key, methods, budget, ...)` for the images
of each method (drawn by `render.py`), `generate(key, method, ...)` for answers (kept under
`answer_cache.answer_key`), and `method_specs()` / `parameters()` / `TEXT_MODES` for what to offer
(the registry's `MethodSpec`s), so `components/` imports no pruner, model or in-LLM module;
`warm_up` compiles the decoding path for the first views' shapes at start-up (model-level, no session).

Budgets, method names and parameters come validated from the edges (the app's settings, the
Python API's `mipruner.select`); the service passes them on and does not check them again, except
that `view` resolves the budget against the encoding once, before any panel, so a budget that does
not fit is the request's error and not each method's (`failures.py`: a failing method costs only
its own panel).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import mipruner
from mipruner.models.common.text import TEXT_MODES
from mipruner.models.common.views import check_views
from mipruner.pruners.signals import Signals, encode_kwargs, recorded
from mipruner.pruners import (MethodSpec, Param, Selection, all_params, check_budget, get_pruner, list_pruners,
                              resolve_budget)

from ..measure.compute import attach_compute
from ..viz import Layout, video as viz_video
from .answer_cache import answer_key
from .batch import answer_batch_guarded
from .export import selection_to_json
from .failures import guarded, request_errors
from .prompt_words import PromptWords, prompt_words
from .render import MethodView, failed_view, render_view
from .session import CacheBudget, CachedEncoding, EncodingKey, Session, media_hash, model_storages, nbytes
from .turns import Busy, Turns, visitor
from .warm_up import warm_up as _warm_up

DEFAULT_CACHE_BYTES = 1 << 30  # 1 GiB of cached encodings across all sessions (LLaVA-1.5: ~15 MB each)


def load_adapter(name_or_path: str, device=None, dtype=None):
    """Load a model by hub id, local directory or alias and return its adapter (`mipruner.load`)."""
    return mipruner.load(name_or_path, device=device, dtype=dtype)


def method_specs() -> list[MethodSpec]:
    """Every registered method's spec (name, label, stage, needs, params), sorted by name."""
    return [get_pruner(n) for n in list_pruners()]


def method_spec(name: str) -> MethodSpec:
    """The spec of method `name`; unknown names raise ValueError with "did you mean"."""
    return get_pruner(name)


def parameters() -> dict[str, Param]:
    """Every registered method parameter by name (one definition per name)."""
    return all_params()


@dataclass(frozen=True)
class Panel:
    """A method to show in one panel: its registry name, an optional label and parameter overrides
    (so one method can take two panels). An unknown name raises where it is used, with "did you mean"."""

    name: str
    params: dict = field(default_factory=dict, hash=False)
    label: str = ""

    @property
    def title(self) -> str:
        return self.label or self.name


def _panel(m) -> Panel:
    return m if isinstance(m, Panel) else Panel(m)


# ---------------------------------------------------------------------------------- the engine


class ModelService:
    """Owns one adapter (or a loader called once, on first use); serves any number of sessions.

    adapter_or_loader: a `mipruner.models.Adapter`, or a zero-argument callable returning one (e.g. `lambda:
    mipruner.load(path)`), so the app can start before the model is loaded. clock: seconds, monotonic (tests pass
    a fake one to check expiry). cache: the byte cap over every session's encodings (share one between the engines
    of an app); default: a cap of DEFAULT_CACHE_BYTES for this engine's sessions. max_waiting: requests one
    session may have waiting for the model (more are refused at once, `turns.Busy`); None: no cap.
    """

    def __init__(self, adapter_or_loader, *, name: str | None = None,
                 clock: Callable[[], float] = time.monotonic, session_entries: int = 3,
                 session_max_age_s: float = 1800.0, cache: CacheBudget | None = None, max_waiting: int | None = 2):
        from mipruner.models.base import Adapter

        if isinstance(adapter_or_loader, Adapter):
            self._adapter, self._loader = adapter_or_loader, None
        elif callable(adapter_or_loader):
            self._adapter, self._loader = None, adapter_or_loader
        else:
            raise ValueError("ModelService needs an Adapter or a zero-argument callable returning one, "
                             f"got {type(adapter_or_loader).__name__}")
        self._name = name
        self._model_lock = Turns(max_waiting)  # one forward pass at a time, sessions taking turns (turns.py)
        self._load_lock = threading.Lock()
        self.clock, self.session_entries, self.session_max_age_s = clock, session_entries, session_max_age_s
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

    def _attach(self, session: Session) -> Session:
        """A session without a byte cap (made by hand, or unpickled and not adopted) comes under this
        engine's."""
        if session.budget is None:
            session.budget = self.cache
        return session

    def _account(self, session: Session, key: EncodingKey) -> None:
        """Report the entry's current size to the byte cap (which may drop other entries)."""
        if self._weights is None:  # the model's own tensors are shared, never charged to a session
            self._weights = model_storages(self.adapter)
        with session.lock:
            e = session.entries.get(key)
            size = nbytes(e, self._weights, (self.adapter,)) if e is not None else 0
        if e is not None:
            self._attach(session).charge(key, size)

    # -- encode

    def encode(self, session: Session, media, prompt: str, text_mode: str = "question",
               need_attention: bool | None = None, methods=(), views: str = "all") -> EncodingKey:
        """Encode (media, prompt) unless this session has it cached; returns the cache key.

        need_attention=None: True when any of `methods` (names or Panels) needs the vision encoder's attention
        (an encoding with it also serves requests without it). The other signals `methods` ask for
        (`mipruner.signals_for`) are recorded in the same pass; a method chosen later that asks for one the
        cached encoding lacks re-encodes it in place (`_extend`). `views` ("all" or "base", `check_views`): keyed."""
        names = [_panel(m).name for m in methods]
        if need_attention is None:
            need_attention = mipruner.needs_attention(names)
        want, views = Signals.of(bool(need_attention), mipruner.signals_for(names)), check_views(self.adapter, views)
        key = EncodingKey(self.model_name, media_hash(media), prompt, text_mode, bool(need_attention), views)
        found = self._attach(session).find((key, key._replace(need_attention=True)), self.clock())
        if found is not None:
            self._ensure(session, found, want=want)
            return found
        read = self.adapter.read_media(media)  # a file is decoded here, outside the model's slot
        with self._model_lock.turn(session):
            enc = self.adapter.encode(read, prompt, text_mode=text_mode, **encode_kwargs(want, views))
        session.put(key, enc, self.clock()).source = (media, prompt, text_mode, views)
        self._account(session, key)
        return key

    def _extend(self, session: Session, e: CachedEncoding, want: Signals) -> CachedEncoding:
        """Re-encode entry `e` in place with `want` added when its encoding lacks some of what `want` asks beyond
        the default block's attention (the app encodes with that, before the methods are chosen); its selection
        cache is cleared (the answers stay: same tokens). When the model cannot give it (a block its encoder
        lacks, an adapter that records no more) the entry stays as it is and that request is not retried: the
        method then fails on its own, `select` saying what the encoding lacks (or takes its fallback)."""
        have = recorded(e.encoded)
        extra = Signals(want.layers - {None}, want.heads, want.features)  # the default block's attention is
        if have.covers(extra) or e.source is None or extra in e.refused:  # the key's own `need_attention`
            return e
        media, prompt, text_mode, views = e.source
        try:
            read = self.adapter.read_media(media)  # decoded outside the model's slot
            with self._model_lock.turn(session):
                enc = self.adapter.encode(read, prompt, text_mode=text_mode, **encode_kwargs(have | want, views))
        except (TypeError, ValueError):
            with session.lock:
                e.refused.add(extra)
            return e
        with session.lock:
            e.encoded = enc
            e.mi_cache.clear()
            if not recorded(enc).covers(extra):  # the adapter recorded less than asked: not asked again
                e.refused.add(extra)
        return e

    def _ensure(self, session: Session, key: EncodingKey, methods=(), want: Signals | None = None) -> CachedEncoding:
        """The entry for `key`, extended with `want` or the signals of `methods` (names or Panels); a re-encoding
        (more signals: more bytes) is charged to the byte cap."""
        e = self.entry(session, key)
        before = e.encoded
        self._extend(session, e, want if want is not None else mipruner.signals_for(_panel(m).name for m in methods))
        if e.encoded is not before:
            self._account(session, key)
        return e

    def entry(self, session: Session, key: EncodingKey) -> CachedEncoding:
        """The cached encoding for `key`; StaleKeyError when it was evicted, expired or never made."""
        return self._attach(session).get(key, self.clock())

    def encoded(self, session: Session, key: EncodingKey):
        return self.entry(session, key).encoded

    def layout(self, session: Session, key: EncodingKey) -> Layout:
        e = self.entry(session, key)
        with session.lock:
            if e.layout is None:
                e.layout = viz_video.video_layout(e.encoded)  # a video: its frames in a grid
            return e.layout

    # -- prune / view

    def _prune(self, e: CachedEncoding, method: str, budget, params: dict, session=None) -> Selection:
        kw = dict(cache=e.mi_cache, strict=False, **params)
        if get_pruner(method).stage == "llm":  # runs the first K decoder layers once per (encoding, K), then re-ranks
            with self._model_lock.turn(session):
                return mipruner.select(self.adapter, e.encoded, method, budget, **kw)
        return attach_compute(self.adapter, e.encoded, mipruner.select(None, e.encoded, method, budget, **kw))

    def prune(self, session: Session, key: EncodingKey, method: str, budget, **params) -> Selection:
        """`mipruner.prune` on the cached encoding, with its attention/keys/seed/MI cache passed in.
        Parameters a method does not accept are ignored (one params dict serves every method)."""
        e = self._ensure(session, key, [method])
        with session.lock:
            sel = self._prune(e, method, budget, params, session)
        self._account(session, key)
        return sel

    def try_prune(self, session: Session, key: EncodingKey, method: str, budget,
                  **params) -> tuple[Selection | None, str | None]:
        """`prune`, a failing method costing only its own result (`failures.guarded`): (selection, None),
        or (None, the sentence of its failure)."""
        return guarded(method, lambda: self.prune(session, key, method, budget, **params))

    def view(self, session: Session, key: EncodingKey, methods: list, budget, params: dict | None = None,
             heat_token: int | None = None) -> list[MethodView]:
        """Prune with each method and render its panel: mask, heatmap, pivot map (MI methods).

        methods: Panels or names; params: shared pruner parameters, overridden per Panel;
        heat_token: a scoring-text token index for the MI methods' PMI heatmap (None: the scores).
        A method that raises or breaks the contract on this input costs only its own panel: its view
        has `error` (one sentence) and no selection or images; the other views render. A built-in's
        ValueError (settings that do not fit this input) stays the request's error (`request_errors`).
        """
        e = self._ensure(session, key, methods)  # every method's signals in one re-encoding (else each below)
        lay = self.layout(session, key)
        out = []
        resolve_budget(budget, e.encoded.n_visual)  # a bad budget is the request's error, not a method's
        with session.lock:
            for m in methods:
                panel = _panel(m)
                view, why = guarded(panel.name, lambda panel=panel: self._view_one(session, e, lay, panel, budget,
                                                                                   params, heat_token),
                                    request_errors(panel.name))
                out.append(view or failed_view(panel.name, panel.title, why))
        self._account(session, key)
        return out

    def _view_one(self, session: Session, e: CachedEncoding, lay, panel: Panel, budget, params: dict | None,
                  heat_token: int | None) -> MethodView:
        self._extend(session, e, get_pruner(panel.name).signals)
        t0 = time.perf_counter()
        sel = self._prune(e, panel.name, budget, {**(params or {}), **panel.params}, session)
        return render_view(e.encoded, sel, lay, e.drawn, method=panel.name, label=panel.title,
                           heat_token=heat_token, prune_ms=(time.perf_counter() - t0) * 1e3)

    # -- generate

    def cached_answer(self, session: Session, key: EncodingKey, method: str | None, budget=None,
                      params: dict | None = None, max_new_tokens: int = 64):
        """The answer `generate` would return if it is already cached, else None (never runs the LLM)."""
        e = self.entry(session, key)
        akey = answer_key(e.encoded.n_visual, method, budget, params, max_new_tokens)
        with session.lock:
            return e.answers.get(akey)

    def generate(self, session: Session, key: EncodingKey, method: str | None, budget=None,
                 params: dict | None = None, max_new_tokens: int = 64, **gen):
        """The answer on the kept tokens (method=None: unpruned), cached per (encoding, method, budget, its
        params, max_new_tokens); gen: `mipruner.answer`'s (the app's streams: a logits_processor that watches)."""
        e = self._ensure(session, key, [] if method is None else [method])
        enc = e.encoded
        akey = answer_key(enc.n_visual, method, budget, params, max_new_tokens)
        with session.lock:
            if akey in e.answers:
                return e.answers[akey]
            sel = None if method is None else self._prune(e, method, budget, params or {}, session)
        with self._model_lock.turn(session):
            ans = mipruner.answer(self.adapter, enc, sel, max_new_tokens=max_new_tokens, cache=e.mi_cache, **gen)
        with session.lock:
            e.answers[akey] = ans
        self._account(session, key)
        return ans

    @property
    def model_lock(self) -> Turns:
        """The model's slot (`turns.Turns`); a caller running the adapter itself (sweeps) holds it (`with`) per item."""
        return self._model_lock

    def generate_many(self, session: Session, key: EncodingKey, methods: list, budget=None,
                      params: dict | None = None, max_new_tokens: int = 64) -> list:
        """The unpruned reference and each of `methods`' answers on one encoding, decoded as ONE batch
        (`mipruner.answer_batch`: pre-LLM methods' kept sets packed into one prefill; in-LLM methods answer one by one).
        methods: names or Panels; params: shared, overridden per Panel, as in `view`. Answers already cached are
        reused; new ones fill the same cache as `generate` (so a later `generate` or `cached_answer` returns them).
        A method whose selection or answer fails costs only its own entry: the sentence (str) of its failure stands
        in its place. Returns [reference, one Answer (or sentence) per entry of `methods`]."""
        e = self._ensure(session, key, methods)
        enc = e.encoded
        panels = [_panel(m) for m in methods]
        wanted = [(None, {})] + [(p.name, {**(params or {}), **p.params}) for p in panels]
        akeys = [answer_key(enc.n_visual, m, budget, p, max_new_tokens) for m, p in wanted]
        todo: dict = {}  # answer key -> selection, first occurrence only
        failed: dict = {}  # answer key -> the sentence of its failure (never cached: a retry may succeed)
        with session.lock:
            for (m, p), k in zip(wanted, akeys):
                if k not in e.answers and k not in todo and k not in failed:
                    sel, why = (None, None) if m is None else guarded(
                        m, lambda m=m, p=p: self._prune(e, m, budget, p, session), request_errors(m))
                    if why is None:
                        todo[k] = sel
                    else:
                        failed[k] = why
        if todo:
            with self._model_lock.turn(session):  # one batch; if one selection's answer breaks it, each alone
                got, whys = answer_batch_guarded(self.adapter, enc, list(todo.values()), max_new_tokens=max_new_tokens,
                                                 cache=e.mi_cache)
            failed.update((k, why) for k, why in zip(todo, whys) if why is not None)
            with session.lock:
                e.answers.update((k, a) for k, a in zip(todo, got) if a is not None)
        with session.lock:
            return [failed[k] if k in failed else e.answers[k] for k in akeys]

    def warm_up(self, media, prompt: str, methods, budget, max_new_tokens: int,
                on_batch: Callable[[int, int, str], None] | None = None, **path) -> int:
        """`mipruner.serve.warm_up.warm_up` on this model, each batch holding its slot; requests meanwhile take turns."""
        return _warm_up(self.adapter, self._model_lock, media, prompt, methods, budget, max_new_tokens, on_batch, **path)

    def export_json(self, session: Session, key: EncodingKey, method: str, budget, **params) -> str:
        sel = self.prune(session, key, method, budget, **params)
        return selection_to_json(self.encoded(session, key), sel)


__all__ = ["Busy", "DEFAULT_CACHE_BYTES", "TEXT_MODES", "ModelService", "MethodView", "Panel", "PromptWords", "check_budget",
           "load_adapter", "method_spec", "method_specs", "parameters", "visitor"]
