"""One model, many browser sessions: encode once, prune and render many times, generate on demand.

`Engine` owns ONE model adapter (loaded once, shared, read-only); its forward passes (encode,
generate) run under a lock. Everything per user lives in a `Session` (one per browser session),
which holds its own small LRU cache of encodings, keyed by (model, media content hash, prompt,
text_mode, need_attention) and expiring by count and by idle age. Per encoding it also keeps the
MI cache (`cache=` of `mipruner.prune`, which makes a slider move cheap), the render `Layout`, and
the answers generated so far. Sessions share no mutable state; the engine holds no per-user state.

The UI calls only this module (and `Settings`): `encode -> key`, `view(key, methods, budget, ...)`
for the images of each method, `generate(key, method, ...)` for answers.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
from PIL import Image

import mipruner
from mipruner import inllm
from mipruner.eval.runner import prune_kwargs
from mipruner.pruners import Selection, get_pruner, resolve_budget
from mipruner.pruners.mi import AGGREGATIONS, NORMALIZATIONS

from . import viz


class EncodingKey(NamedTuple):
    """What one cached encoding is of. `media` is a sha256 of the media's content."""

    model: str
    media: str
    prompt: str
    text_mode: str
    need_attention: bool


class StaleKeyError(LookupError):
    """The key names no encoding of this session (never encoded, evicted or expired)."""


def check_method(name: str) -> None:
    """A registry pruner or an in-LLM method (`mipruner.inllm`); unknown names raise ValueError."""
    if not inllm.is_in_llm(name):
        get_pruner(name)  # "did you mean" for unknown names


def method_params(name: str) -> set[str]:
    """The parameter names method `name` accepts."""
    return set(inllm.defaults(name)) if inllm.is_in_llm(name) else set(get_pruner(name).params)


# ---------------------------------------------------------------------------------- media hashing

def media_hash(media: Any) -> str:
    """sha256 of the media's content: file bytes for a path, pixels for images, frames for videos."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, Image.Image):
            h.update(f"img:{x.mode}:{x.size}".encode())
            h.update(x.tobytes())
        elif isinstance(x, np.ndarray):
            h.update(f"arr:{x.dtype}:{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, (list, tuple)):
            h.update(f"list:{len(x)}".encode())
            for item in x:
                feed(item)
        elif isinstance(x, (str, os.PathLike)):
            path = os.fspath(x)
            h.update(f"file:{os.path.splitext(path)[1].lower()}".encode())  # the suffix picks image vs video
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        elif hasattr(x, "frames") and hasattr(x, "indices"):  # mipruner.media.Video
            h.update(f"video:{x.indices}:{x.fps}".encode())
            feed(list(x.frames))
        else:
            raise ValueError(f"unsupported media type {type(x).__name__}: give a path, a PIL image, an "
                             "array, a list of images or a Video")

    feed(media)
    return h.hexdigest()


# ---------------------------------------------------------------------------------- session state

@dataclass
class CachedEncoding:
    """One encoding and what was derived from it in this session."""

    encoded: Any  # mipruner.models.Encoded
    mi_cache: dict = field(default_factory=dict)  # method name -> the pruner's `cache=` dict
    layout: viz.Layout | None = None
    answers: dict = field(default_factory=dict)  # answer key -> Answer
    created: float = 0.0
    last_used: float = 0.0


@dataclass
class Session:
    """Per-browser-session state: an LRU of encodings. Never shared between sessions.

    max_entries: encodings kept (each holds N_V x d floats and their PMI caches);
    max_age_s: an encoding unused for this long is dropped.
    """

    max_entries: int = 3  # a handful of images per user; each is ~10 MB at 576 x 4096 fp32
    max_age_s: float = 1800.0  # 30 min idle: a user who walked away frees their memory
    entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self):
        if not (isinstance(self.max_entries, int) and self.max_entries >= 1):
            raise ValueError(f"max_entries must be an int >= 1, got {self.max_entries!r}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {self.max_age_s!r}")

    def keys(self) -> list[EncodingKey]:
        return list(self.entries)

    def expire(self, now: float) -> None:
        for k in [k for k, e in self.entries.items() if now - e.last_used > self.max_age_s]:
            del self.entries[k]
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)  # least recently used first


@dataclass(frozen=True)
class MethodSpec:
    """A method to show: registry name, optional label and parameter overrides."""

    name: str
    params: dict = field(default_factory=dict, hash=False)
    label: str = ""

    def __post_init__(self):
        check_method(self.name)  # unknown names raise with "did you mean"

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass
class MethodView:
    """What one method panel shows after a slider move."""

    method: str
    label: str
    selection: Selection
    kept: int
    share: float  # kept / N_V
    prune_ms: float
    render_ms: float
    mask: Image.Image
    heatmap: Image.Image  # PMI with `heat_token` for MI methods when given, else the method's scores
    heat_title: str
    pivot: Image.Image | None = None  # MI methods only
    legend: list[tuple[str, str]] | None = None


# ---------------------------------------------------------------------------------- settings

_CODES = {"methods": "m", "budget": "b", "lam": "lam", "tau": "tau", "aggregation": "agg",
          "normalization": "norm", "text_mode": "tm", "seed": "seed", "theta": "theta",
          "dominant_ratio": "dom", "ratio": "vr", "split": "split", "layer": "K", "heat": "ht"}
_SHARES = ("theta", "dominant_ratio", "ratio", "split")  # method parameters in [0, 1]


@dataclass(frozen=True)
class Settings:
    """The app's controls, and their compact string form (`to_string` / `Settings.parse`).

    `m=mi,random&b=64&lam=0.5&tau=0.1&agg=max&norm=softmax&tm=question&seed=0&theta=0.5&...`; b is
    tokens (int) or a share (float in (0, 1]). Method parameters: theta (CDPruner), dom (VisionZip's
    dominant share), vr (VisPruner's important share), split (MI+Attention's first-round share),
    K (FastV / DART's decoder layer);
    ht: the prompt token whose PMI the heatmaps show (-1: each method's scores).
    Invalid values raise ValueError naming the field.
    """

    methods: tuple[str, ...] = ("mi", "random", "similarity")
    budget: int | float = 64  # paper: LLaVA-1.5 keeps 128 / 64 / 32 of 576
    lam: float = 0.5  # paper Sec. 4.4: 0.5 open-ended, 1 closed-form
    tau: float = 0.1  # paper Tab. 4
    aggregation: str = "max"
    normalization: str = "softmax"
    text_mode: str = "question"
    seed: int = 0
    theta: float = 0.5
    dominant_ratio: float = 0.84375
    ratio: float = 0.5
    split: float = 0.5
    layer: int = 2  # FastV / DART: the decoder layer K where they prune (both papers: 2)
    heat: int = -1

    def __post_init__(self):
        from mipruner.models.text import TEXT_MODES

        def bad(name: str, msg: str):
            raise ValueError(f"settings field {_CODES[name]!r} ({name}): {msg}")

        methods = (self.methods,) if isinstance(self.methods, str) else tuple(self.methods)
        if not methods:
            bad("methods", "at least one method is needed")
        for m in methods:
            try:
                check_method(m)
            except ValueError as e:
                bad("methods", str(e))
        if len(set(methods)) != len(methods):
            bad("methods", f"duplicate methods in {list(methods)}")
        object.__setattr__(self, "methods", methods)
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            bad("budget", f"must be an int >= 1 (tokens) or a float in (0, 1] (share), got {b!r}")
        if isinstance(b, float) and not (0.0 < b <= 1.0):
            bad("budget", f"a share must be in (0, 1], got {b}")
        if isinstance(b, int) and b < 1:
            bad("budget", f"tokens must be >= 1, got {b}")
        if not (isinstance(self.lam, (int, float)) and 0.0 <= self.lam <= 1.0):
            bad("lam", f"must be in [0, 1], got {self.lam!r}")
        if not (isinstance(self.tau, (int, float)) and 0.0 < self.tau < math.inf):
            bad("tau", f"must be a finite number > 0, got {self.tau!r}")
        if self.aggregation not in AGGREGATIONS:
            bad("aggregation", f"must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.normalization not in NORMALIZATIONS:
            bad("normalization", f"must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        if self.text_mode not in TEXT_MODES:
            bad("text_mode", f"must be one of {TEXT_MODES}, got {self.text_mode!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            bad("seed", f"must be an int >= 0, got {self.seed!r}")
        for name in _SHARES:
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                bad(name, f"must be in [0, 1], got {v!r}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 1:
            bad("layer", f"must be an int >= 1, got {self.layer!r}")
        if isinstance(self.heat, bool) or not isinstance(self.heat, int) or self.heat < -1:
            bad("heat", f"must be a prompt-token index >= 0, or -1 for none, got {self.heat!r}")

    def params(self) -> dict:
        """Keyword parameters for the pruners (each pruner takes the ones it accepts)."""
        return {"lam": float(self.lam), "tau": float(self.tau), "aggregation": self.aggregation,
                "normalization": self.normalization, "seed": self.seed, "layer": self.layer,
                **{name: float(getattr(self, name)) for name in _SHARES}}

    def method_specs(self) -> list[MethodSpec]:
        return [MethodSpec(m) for m in self.methods]

    def to_string(self) -> str:
        vals = {"methods": ",".join(self.methods), "budget": repr(self.budget) if isinstance(self.budget, float)
                else str(self.budget), "lam": repr(float(self.lam)), "tau": repr(float(self.tau)),
                "aggregation": self.aggregation, "normalization": self.normalization,
                "text_mode": self.text_mode, "seed": str(self.seed), "heat": str(self.heat),
                "layer": str(self.layer),
                **{name: repr(float(getattr(self, name))) for name in _SHARES}}
        return "&".join(f"{_CODES[k]}={vals[k]}" for k in _CODES)

    @classmethod
    def parse(cls, s: str) -> "Settings":
        """Settings from `to_string`'s form; missing fields take defaults, unknown ones raise."""
        by_code = {c: name for name, c in _CODES.items()}
        kw: dict[str, Any] = {}
        for part in (p for p in s.strip().lstrip("?").split("&") if p):
            code, sep, val = part.partition("=")
            code = code.strip()
            if not sep:
                raise ValueError(f"settings field {code!r}: expected {code}=<value>")
            if code not in by_code:
                raise ValueError(f"settings field {code!r} is unknown; known fields: {', '.join(by_code)}")
            name = by_code[code]
            if name in kw:
                raise ValueError(f"settings field {code!r} is given twice")
            val = val.strip()
            try:
                if name == "methods":
                    kw[name] = tuple(m.strip() for m in val.split(",") if m.strip())
                elif name == "budget":
                    kw[name] = float(val) if any(c in val for c in ".eE") else int(val)
                elif name in ("lam", "tau", *_SHARES):
                    kw[name] = float(val)
                elif name in ("seed", "heat", "layer"):
                    kw[name] = int(val)
                else:
                    kw[name] = val
            except ValueError:
                raise ValueError(f"settings field {code!r} ({name}): cannot read {val!r}") from None
        return cls(**kw)


# ---------------------------------------------------------------------------------- JSON export

def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def selection_to_json(encoded, selection: Selection, *, indent: int | None = None) -> str:
    """One selection with its scores, PMI and geometry as JSON (non-finite numbers -> null)."""
    geo = encoded.geometry
    doc = {
        "model": encoded.model, "prompt": encoded.prompt, "text_mode": encoded.text_mode,
        "method": selection.method, "n_visual": encoded.n_visual, "kept": selection.budget,
        "keep": selection.keep.tolist(), "order": selection.order.tolist(),
        "scores": [_finite(v) for v in selection.scores.tolist()],
        "text_tokens": list(encoded.scoring_tokens),
        "geometry": {"frame": geo.frame.tolist(), "row": geo.row.tolist(), "col": geo.col.tolist(),
                     "box": geo.box.tolist(), "kind": list(geo.kind), "grids": [list(g) for g in geo.grids],
                     "sizes": [list(s) for s in geo.sizes]},
    }
    if selection.pmi is not None:
        doc["pmi"] = [[_finite(v) for v in row] for row in selection.pmi.tolist()]
    if selection.pivot is not None:
        toks = encoded.scoring_tokens
        doc["pivot"] = selection.pivot.tolist()
        doc["pivot_tokens"] = [toks[j] if j < len(toks) else None for j in doc["pivot"]]
    return json.dumps(doc, indent=indent)


# ---------------------------------------------------------------------------------- the engine

def _freeze(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


class Engine:
    """Owns one adapter (or a loader called once, on first use); serves any number of sessions.

    adapter_or_loader: a `mipruner.models.Adapter`, or a zero-argument callable returning one
    (e.g. `lambda: mipruner.load(path)`), so the app can start before the model is loaded.
    clock: seconds, monotonic (tests pass a fake one to check expiry).
    """

    def __init__(self, adapter_or_loader, *, name: str | None = None,
                 clock: Callable[[], float] = time.monotonic, session_entries: int = 3,
                 session_max_age_s: float = 1800.0):
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
        return Session(max_entries=self.session_entries, max_age_s=self.session_max_age_s)

    # -- encode

    def encode(self, session: Session, media, prompt: str, text_mode: str = "question",
               need_attention: bool | None = None, methods=()) -> EncodingKey:
        """Encode (media, prompt) unless this session has it cached; returns the cache key.

        need_attention=None: True when any of `methods` (names or MethodSpecs) needs the vision
        encoder's attention. An encoding with attention also serves requests without it.
        """
        if need_attention is None:
            names = [m.name if isinstance(m, MethodSpec) else m for m in methods]
            need_attention = any(get_pruner(n).needs_attention for n in names if not inllm.is_in_llm(n))
        key = EncodingKey(self.model_name, media_hash(media), prompt, text_mode, bool(need_attention))
        with session.lock:
            now = self.clock()
            session.expire(now)
            for k in (key, key._replace(need_attention=True)):
                if k in session.entries:
                    session.entries.move_to_end(k)
                    session.entries[k].last_used = now
                    return k
        with self._model_lock:
            enc = self.adapter.encode(media, prompt, text_mode=text_mode, need_attention=bool(need_attention))
        with session.lock:
            now = self.clock()
            session.entries[key] = CachedEncoding(encoded=enc, created=now, last_used=now)
            session.entries.move_to_end(key)
            session.expire(now)
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
        params = dict(params)
        seed = params.pop("seed", None)
        enc = e.encoded
        if inllm.is_in_llm(method):
            # runs the first K decoder layers once per (encoding, K), then only re-ranks
            kw = {k: v for k, v in params.items() if k in method_params(method)}
            with self._model_lock:
                return inllm.select(self.adapter, enc, method, budget, cache=e.mi_cache.setdefault("inllm", {}),
                                    **kw)
        kw = prune_kwargs(method, enc, params, seed, e.mi_cache)
        return mipruner.prune(method, visual=enc.visual, text=enc.scoring_text, budget=budget, **kw)

    def prune(self, session: Session, key: EncodingKey, method: str, budget, **params) -> Selection:
        """`mipruner.prune` on the cached encoding, with its attention/keys/seed/MI cache passed in.
        Parameters a method does not accept are ignored (one params dict serves every method)."""
        e = self.entry(session, key)
        with session.lock:
            return self._prune(e, method, budget, params)

    def view(self, session: Session, key: EncodingKey, methods: list, budget, params: dict | None = None,
             heat_token: int | None = None) -> list[MethodView]:
        """Prune with each method and render its panel: mask, heatmap, pivot map (MI methods).

        methods: MethodSpecs or names; params: shared pruner parameters, overridden per MethodSpec;
        heat_token: a scoring-text token index for the MI methods' PMI heatmap (None: the scores).
        """
        e = self.entry(session, key)
        enc = e.encoded
        lay = self.layout(session, key)
        out = []
        with session.lock:
            for m in methods:
                spec = m if isinstance(m, MethodSpec) else MethodSpec(m)
                t0 = time.perf_counter()
                sel = self._prune(e, spec.name, budget, {**(params or {}), **spec.params})
                t1 = time.perf_counter()
                mask = viz.kept_mask(enc, sel, layout=lay)
                pivot = legend = None
                if sel.pmi is not None and sel.pivot is not None:
                    pivot, legend = viz.pivot_map(enc, sel, layout=lay)
                if heat_token is not None and sel.pmi is not None:
                    heat = viz.pmi_heatmap(enc, sel, heat_token, layout=lay)
                    title = f"PMI with {enc.scoring_tokens[heat_token]!r}"
                else:
                    heat, title = viz.scores_heatmap(enc, sel.scores, layout=lay), f"{spec.name} scores"
                t2 = time.perf_counter()
                out.append(MethodView(method=spec.name, label=spec.title, selection=sel, kept=sel.budget,
                                      share=sel.budget / enc.n_visual, prune_ms=(t1 - t0) * 1e3,
                                      render_ms=(t2 - t1) * 1e3, mask=mask, heatmap=heat, heat_title=title,
                                      pivot=pivot, legend=legend))
        return out

    # -- generate

    def _answer_key(self, enc, method: str | None, budget, params: dict | None, max_new_tokens: int) -> tuple:
        if method is None:
            return (None, None, (), max_new_tokens)
        accepted = method_params(method)
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
            if sel is not None and inllm.is_in_llm(method):
                ans = inllm.generate(self.adapter, enc, sel, layer=sel.extras["layer"], max_new_tokens=max_new_tokens,
                                     cache=e.mi_cache.setdefault("inllm", {}))
            else:
                ans = self.adapter.generate(enc, keep=sel, max_new_tokens=max_new_tokens)
        with session.lock:
            e.answers[akey] = ans
        return ans

    def export_json(self, session: Session, key: EncodingKey, method: str, budget, **params) -> str:
        sel = self.prune(session, key, method, budget, **params)
        return selection_to_json(self.encoded(session, key), sel)


__all__ = ["CachedEncoding", "Engine", "EncodingKey", "MethodSpec", "MethodView", "Session", "Settings",
           "StaleKeyError", "media_hash", "selection_to_json"]
