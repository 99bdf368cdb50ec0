"""What the app's buttons and sliders do, without Gradio: encode, view, generate, inspect, export.

Every handler takes the caller's `UIState` (one per browser session, held by `gr.State`) and
returns plain values; `components.page.handlers` turns them into the page's outputs. Nothing here is shared
between sessions except the model engines (`components.hosting.hub`), which hold no per-user state.
User mistakes raise `UserError` with a message meant for the page.
"""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from dataclasses import dataclass, field

from mipruner.serve.service import MethodView, method_spec, method_specs
from mipruner.media import is_video_path
from mipruner.models.common.generation import GenerationConfig
from mipruner.serve.session import EncodingKey, FileBudget, Session, StaleKeyError

from ..hosting.hub import ModelHub
from ..hosting.spaces_gpu import DURATIONS, generate_seconds
from .answers import Record, answer_dict, stream
from .checks import UserError, budget_of, probe_video
from .exports import write_export
from .messages import clean_prompt, crop_note, plain, unknown_words_warning
from .settings import Settings
from .views import views_for, views_note

MAX_PANELS = 6
MAX_PROMPT_CHARS = 2000  # a question about a picture; longer prompts are refused before tokenizing


@dataclass
class UIState:
    """One browser session's state: its encodings cache and which encoding is on screen."""

    session: Session | None = None
    model: str = ""
    key: EncodingKey | None = None
    tokens: list[str] = field(default_factory=list)
    n_visual: int = 0
    n_layers: int = 0  # decoder layers of the model (FastV / DART's K is at most this)
    n_frames: int = 0  # frames of the encoding on screen (a video's: the page's frame selector)
    lam_auto: float | None = None  # the lam MI-Pruner's lam_rule "auto" applies to this encoding's prompt
    noted: bool = False  # the start-up notes (the fallback sentence) were shown to this session once


def label(name: str) -> str:
    """A method's display name, from its registered spec."""
    return method_spec(name).label


def method_choices() -> list[tuple[str, str]]:
    """(label, registry name) for every registered method."""
    return [(s.label, s.name) for s in method_specs()]


@contextlib.contextmanager
def user_errors(doing: str, advice: str):
    """Turn what can go wrong while `doing` into UserErrors: expired cache entries, bad input
    (ValueError, incl. MediaError) and out-of-memory (with `advice`)."""
    try:
        yield
    except StaleKeyError:
        raise UserError("this result expired from the cache: press Run again") from None
    except (ValueError, OSError) as e:  # bad media, empty or too long prompt, unsupported media, bad parameter
        raise UserError(plain(e)) from None
    except MemoryError:
        raise UserError(f"out of memory while {doing}: {advice}") from None
    except RuntimeError as e:
        if "out of memory" in str(e).lower():
            raise UserError(f"out of memory while {doing}: {advice}") from None
        raise


def _budget(settings: Settings, n_visual: int):
    """The settings' budget, a token count clamped to N_V (the slider may exceed a smaller image)."""
    return settings.budget if isinstance(settings.budget, float) else min(settings.budget, n_visual)


class AppLogic:
    """The handlers; one instance per app, shared by all sessions (it holds no user state)."""

    def __init__(self, hub: ModelHub, *, max_new_tokens: int = 32, gpu=None, files: FileBudget | None = None,
                 export_root: str | None = None, notes: str = "", warm=None):
        self.hub = hub
        self.notes = notes  # start-up problems every encode's status line repeats (plug-ins left out)
        self.warm = warm  # the compiled path's warm-up (components.core.warmup.WarmUp; model-level), or None
        self.max_new_tokens = max_new_tokens
        self.files = files  # the byte cap on rendered / exported files (checked after views and exports)
        self.export_root = export_root
        self.gpu = gpu
        self.encode_s: dict = {}  # model -> seconds its last encode took here (the next encode's estimate)
        if gpu is not None:  # e.g. spaces.GPU on a ZeroGPU Space: every handler that runs the model's tensors
            self.encode = gpu(self.encode, DURATIONS["encode"], adopt=self._adopt)
            self.generate = gpu(self.generate, self._generate_seconds, adopt=self._adopt)
            # selections; FastV, DART and SparseVLM run decoder layers (export calls view)
            self.view = gpu(self.view, DURATIONS["view"], adopt=self._adopt)
            self.inspect = gpu(self.inspect, DURATIONS["inspect"], adopt=self._adopt)

    # -- helpers ---------------------------------------------------------------------------

    def _generate_seconds(self, state=None, settings=None, max_new_tokens=None, *args, **kwargs) -> int:
        """ZeroGPU's duration for one Generate, from generate's own arguments (spaces_gpu.generate_seconds)."""
        rows = 1 + min(len(getattr(settings, "methods", ()) or ()), MAX_PANELS)
        try:
            n = int(max_new_tokens or self.max_new_tokens)
        except (TypeError, ValueError, OverflowError):  # generate itself refuses it, in a sentence
            n = self.max_new_tokens
        return generate_seconds(rows, n)

    def _adopt(self, state: UIState) -> None:
        """A state back from a ZeroGPU worker: its session goes under the app's byte cap again."""
        if isinstance(state, UIState) and state.session is not None and state.session.budget is None:
            self.hub.get(None)[0].adopt(state.session)

    def _engine(self, state: UIState):
        engine, _ = self.hub.get(state.model)
        return engine

    def _current(self, state: UIState):
        if state is None or state.key is None or state.session is None:
            raise UserError("run the model first: choose an image or a video, type a prompt and press Run")
        engine = self._engine(state)
        try:
            enc = engine.encoded(state.session, state.key)
        except StaleKeyError:
            raise UserError("this result expired from the cache: press Run again") from None
        return engine, enc

    # -- encode ----------------------------------------------------------------------------

    def encode(self, state: UIState | None, model: str, kind: str, image, video, prompt: str,
               text_mode: str = "question", fewer_views: bool | None = None) -> tuple[UIState, str]:
        """Run the vision tower and embed the prompt (once per media+prompt+views in this session).

        Returns the new state and a status line. kind: "image" or "video" (which input to use). fewer_views: read
        an image as its base view only where the model's family can (`components.core.views`); None: the app's
        default, when the model runs on a CPU."""
        state = state if isinstance(state, UIState) else UIState()
        if state.session is None:
            state.session = self.hub.get(None)[0].new_session()
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("the prompt is empty: ask a question about the image or video")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt is {len(prompt):,} characters long; this app takes at most "
                            f"{MAX_PROMPT_CHARS:,} (ask one short question)")
        prompt, removed = clean_prompt(prompt)
        if not prompt.strip():
            raise UserError("the prompt is empty once its control characters are removed: type a question")
        media = video if kind == "video" else image
        if media is None or media == "":
            raise UserError(f"no {kind} given: upload one, or pick an example")
        if kind == "video":
            if not is_video_path(str(media)):
                raise UserError(f"{os.path.basename(str(media))!r} is not a video file this app reads")
            probe_video(str(media))
        engine, note = self.hub.get(model)
        fewer = engine.adapter.device.type == "cpu" if fewer_views is None else bool(fewer_views)
        views = views_for(engine.adapter, kind, fewer)
        t0 = time.perf_counter()
        with user_errors("encoding", "try a smaller image or a shorter video"):
            key = engine.encode(state.session, media, prompt.strip(), text_mode=text_mode, need_attention=True,
                                views=views)
        enc = engine.encoded(state.session, key)
        self.encode_s[engine.model_name] = time.perf_counter() - t0
        state.model, state.key = engine.model_name, key
        state.tokens, state.n_visual = list(enc.scoring_tokens), enc.n_visual
        state.n_layers = engine.adapter.n_layers
        state.lam_auto = self._lam_auto(engine, state)
        frames = len(enc.geometry.sizes)
        state.n_frames = frames if enc.is_video else 0
        what = f"{frames} frame{'s' * (frames != 1)}" if enc.is_video else "1 image"
        status = (f"**{engine.model_name}**: {what} -> {enc.n_visual} visual tokens, "
                  f"{len(enc.scoring_tokens)} prompt tokens scored; encoded in "
                  f"{(time.perf_counter() - t0) * 1e3:.0f} ms (cached for this session).")
        if removed:
            status += f" {removed} control character{'s' * (removed != 1)} removed from the prompt."
        warning = unknown_words_warning(engine.model_name, engine.prompt_words(prompt.strip()))
        warm = self.warm.note() if self.warm is not None and engine is self.warm.engine else ""  # warming, or failed
        notes = "" if state.noted else self.notes  # once per session: the page's status line keeps saying it
        state.noted = True
        parts = (note, status, views_note(views), crop_note(enc), warning, notes, warm)
        return state, " ".join(p for p in parts if p)

    @staticmethod
    def _lam_auto(engine, state: UIState) -> float | None:
        """The lam MI-Pruner's lam_rule "auto" applies to this prompt, as its selection reports it (None: no
        lam_rule, or MI fails here). One token kept: MI's normalisers are cached per encoding for the view."""
        mi = next((s for s in method_specs() if s.name == "mi"), None)
        if mi is None or not {"lam", "lam_rule"} <= set(mi.param_names):
            return None
        sel, _ = engine.try_prune(state.session, state.key, "mi", 1, lam_rule="auto")
        return None if sel is None or sel.extras.get("lam") is None else float(sel.extras["lam"])

    def frame_box(self, state: UIState, frame: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) of a video's frame in the panels' picture (its frames in a grid)."""
        engine, enc = self._current(state)
        lay = engine.layout(state.session, state.key)
        if not 0 <= frame < len(lay.frame_x):
            raise UserError(f"frame must be in [1, {len(lay.frame_x)}], got {frame + 1}")
        return lay.frame_box(frame)

    # -- view ------------------------------------------------------------------------------

    def view(self, state: UIState, settings: Settings) -> tuple[list[MethodView], dict]:
        """Prune with every chosen method and render its panel; no vision tower, no LLM."""
        engine, enc = self._current(state)
        methods = list(settings.methods)[:MAX_PANELS]
        heat = settings.heat if 0 <= settings.heat < len(enc.scoring_tokens) else None
        with user_errors("pruning", "lower the budget"):
            views = engine.view(state.session, state.key, methods, _budget(settings, enc.n_visual),
                                settings.params, heat_token=heat)
        if self.files is not None:
            self.files.maybe_prune()
        for v in views:
            v.label = label(v.method)
        summary = {"model": state.model, "n_visual": enc.n_visual, "settings": settings.to_string(),
                   "heat_token": None if heat is None else enc.scoring_tokens[heat],
                   "methods": [{"method": v.method, "error": v.error} if v.error is not None else
                               {"method": v.method, "kept": v.kept, "share": round(v.share, 4),
                                "keep": v.selection.keep.tolist(), "prune_ms": round(v.prune_ms, 2),
                                "render_ms": round(v.render_ms, 2)} for v in views]}
        return views, summary

    # -- generate --------------------------------------------------------------------------

    def generate(self, state: UIState, settings: Settings, max_new_tokens: int | None = None,
                 progress=None) -> dict:
        """The unpruned reference answer and each method's answer (cached per settings)."""
        return self._answers(state, settings, max_new_tokens, run=True, progress=progress)

    def cached_answers(self, state: UIState, settings: Settings, max_new_tokens: int | None = None) -> dict:
        """Like `generate` but only what is already cached (never runs the LLM)."""
        return self._answers(state, settings, max_new_tokens, run=False)

    def streams(self, state: UIState) -> bool:
        """Whether the page's answers come one by one as they decode: on a CPU (seconds to minutes each); on a GPU
        (ZeroGPU included) they decode as one batch."""
        return self.gpu is None and self._engine(state).adapter.device.type == "cpu"

    def stream_answers(self, state: UIState, settings: Settings, max_new_tokens: int | None = None):
        """The answers of `generate` as they come (`components.core.answers.stream`: the pruned ones first, the
        unpruned last, each one's text while it decodes); yields a `Record` after every change. Where the
        answers decode as one batch (`streams` false), one Record with them all."""
        engine, enc = self._current(state)
        n = self._max_new(max_new_tokens)
        if not self.streams(state):
            got = self.generate(state, settings, n)
            yield Record(got["reference"], got["methods"])
            return
        methods = list(settings.methods)[:MAX_PANELS]
        yield from stream(engine, state.session, state.key, methods, _budget(settings, enc.n_visual), settings.params,
                          n, guard=lambda: user_errors("generating", "lower the budget or max new tokens"),
                          errors=(UserError,))

    def _max_new(self, max_new_tokens) -> int:
        """The answer length, checked once, here, by the one GenerationConfig (the engine trusts it)."""
        try:
            return GenerationConfig(max_new_tokens=max_new_tokens or self.max_new_tokens).max_new_tokens
        except ValueError as e:
            raise UserError(str(e).replace("max_new_tokens", "max new tokens")) from None

    def _answers(self, state: UIState, settings: Settings, max_new_tokens: int | None, *, run: bool,
                 progress=None) -> dict:
        """{"reference": answer | None, "methods": {name: answer}}; run=False only reads the cache."""
        engine, enc = self._current(state)
        n = self._max_new(max_new_tokens)
        budget = _budget(settings, enc.n_visual)
        todo = [None, *list(settings.methods)[:MAX_PANELS]]
        if run:  # the unpruned reference and every panel's answer decode as one batch
            if progress is not None:
                progress((0, 1), desc=f"answering: unpruned + {len(todo) - 1} methods in one batch")
            with user_errors("generating", "lower the budget or max new tokens"):
                got = engine.generate_many(state.session, state.key, todo[1:], budget, settings.params,
                                           max_new_tokens=n)
        else:
            got = [engine.cached_answer(state.session, state.key, m, budget, settings.params, max_new_tokens=n)
                   for m in todo]
        out = Record()
        for m, ans in zip(todo, got):
            if ans is not None:  # a str: that method failed
                out.put(m, {"error": ans} if isinstance(ans, str) else answer_dict(ans))
        return out.as_dict()

    # -- inspect ---------------------------------------------------------------------------

    def inspect(self, state: UIState, settings: Settings, x: float, y: float) -> dict:
        """The visual token under strip pixel (x, y) of any panel image: where it is, which methods
        keep it, and its PMI with every prompt token (MI's PMI at the current tau/normalization)."""
        from mipruner import viz

        if not (math.isfinite(float(x)) and math.isfinite(float(y))):
            raise UserError(f"x and y must be finite numbers (pixels of the picture), got ({x}, {y})")
        engine, enc = self._current(state)
        lay = engine.layout(state.session, state.key)
        idx = viz.token_at(enc, None, float(x), float(y), layout=lay)
        if idx is None:
            raise UserError(f"no visual token at ({x:.0f}, {y:.0f}): click on the picture")
        budget = _budget(settings, enc.n_visual)
        params = settings.params
        mi = engine.prune(state.session, state.key, "mi", budget, **params)
        kept_by = []
        for m in list(settings.methods)[:MAX_PANELS]:
            sel, _ = engine.try_prune(state.session, state.key, m, budget, **params)
            if sel is not None and idx in set(sel.keep.tolist()):  # a method failing here is shown in its panel
                kept_by.append(m)
        geo = enc.geometry
        row = viz.pmi_row(enc, mi, idx)
        return {"token": idx, "frame": int(geo.frame[idx]), "row": int(geo.row[idx]), "col": int(geo.col[idx]),
                "box": [round(float(b), 1) for b in geo.box[idx].tolist()], "kept_by": kept_by,
                "pivot": enc.scoring_tokens[int(mi.pivot[idx])], "pmi": [[t, round(v, 5)] for t, v in row]}

    # -- export ----------------------------------------------------------------------------

    def new_export_dir(self) -> str:
        """A fresh folder for one export, under `export_root` (kept under the file cap) if given."""
        if self.export_root:
            os.makedirs(self.export_root, exist_ok=True)
        return tempfile.mkdtemp(prefix="mipruner-", dir=self.export_root or None)

    def export(self, state: UIState, settings: Settings, out_dir: str) -> list[str]:
        """PNG of every panel image and JSON of every selection, written under out_dir."""
        views, summary = self.view(state, settings)
        return write_export(views, summary, self._current(state)[1], out_dir)


def check_methods(methods) -> tuple[str, ...]:
    """The chosen methods: at least one, at most MAX_PANELS (their names are checked by `Settings`)."""
    methods = tuple(methods or ())
    if not methods:
        raise UserError("methods: choose at least one method")
    if len(methods) > MAX_PANELS:
        raise UserError(f"methods: choose at most {MAX_PANELS} at once, got {len(methods)}")
    return methods


__all__ = ["AppLogic", "MAX_PANELS", "MAX_PROMPT_CHARS", "UIState", "UserError", "budget_of", "check_methods",
           "label", "method_choices", "probe_video"]
