"""What each of the page's events does, by name: `Handlers` takes plain values (the session's `UIState`,
the controls as a dict by name, `Media` for /encode) and returns named outputs (dataclasses whose
`outputs()` list the values in the order `events.wire` connects them). Nothing here builds or needs a
page: a test calls a handler with plain values and reads its fields.

A user's mistake raises `UserError` (its message is meant for the page; `events.wire` shows it).
The outputs that change a widget's properties are `gr.update` dicts (`controls.budget_slider`,
`panels.panel_updates`), plain dicts a test can read.
"""
from __future__ import annotations

import contextvars
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import gradio as gr

from mipruner.serve.service import parameters

from ..core.logic import MAX_PANELS, AppLogic, UIState, UserError, check_methods
from ..core.messages import plain
from ..core.settings import Settings
from . import controls as C
from . import panels as P
from . import video as V

log = logging.getLogger("mipruner.app")
ENCODE_FIELDS = ("model", "model_path", "use", "image", "video", "prompt")  # /encode's names, before the controls


def token_chips(tokens: list[str], heat: int) -> list[tuple[str, str | None]]:
    """The prompt's scored tokens for the clickable HighlightedText (the heatmap's token marked)."""
    return [(t.replace("\u2581", "").replace("\u0120", "") + " ", "shown" if i == heat else None)
            for i, t in enumerate(tokens)]


def controls_of(vals) -> dict[str, Any]:
    """The control values in `Controls.inputs()` order as a dict by name (`controls.control_names()`)."""
    names = C.control_names()
    vals = list(vals)
    if len(vals) != len(names):
        raise UserError(f"expected {len(names)} control values, got {len(vals)}")
    return dict(zip(names, vals))


def controls_for(settings: Settings, n_visual: int = 0) -> dict[str, Any]:
    """The control values (by name) that reproduce `settings` (what Apply sets)."""
    return controls_of(C.control_values(settings, n_visual))


def _ordered(vals: dict) -> list:
    return [vals[n] for n in C.control_names()]


@dataclass
class Media:
    """What /encode reads besides the controls: the model (a path or id given wins over the list), which
    medium to use ("image" or "video"), the files and the prompt; the page's Run also its "Fewer views for
    speed" box (`fewer_views`; None, as /encode sends: the app's default, `components.core.views`)."""

    model: str = ""
    model_path: str | None = None
    use: str = "image"
    image: Any = None
    video: Any = None
    prompt: str = ""
    fewer_views: bool | None = None

    @classmethod
    def of(cls, *vals) -> "Media":
        """From the values in `ENCODE_FIELDS` order."""
        return cls(**dict(zip(ENCODE_FIELDS, vals, strict=True)))

    @property
    def model_name(self) -> str:
        return (self.model_path or "").strip() or self.model


@dataclass
class Encoded:
    state: UIState
    status: str  # the status line
    tokens: list  # the prompt's scored tokens (`token_chips`)
    budget: dict  # the budget slider's update (range of the new encoding's unit and size)
    heat: dict  # the heatmap token's update (-1 when the old one is out of the new prompt's range)
    layers: list = field(default_factory=list)  # one update per decoder-layer control (the model's depth)
    # the page's only (not /encode's): the lam slider shown at the value lam_rule "auto" applies to the new
    # prompt (an empty update when lam_rule is fixed), and what the last encoding's clicks left: every
    # panel's clicked-patch box hidden, the Inspect section's x, y, PMI and patch emptied
    lam: dict = field(default_factory=dict)
    stale: list = field(default_factory=list)

    def outputs(self) -> tuple:
        return (self.state, self.status, self.tokens, self.budget, self.heat, *self.layers)

    def page_outputs(self, *, lam: bool = True) -> tuple:
        """The page's encode event: /encode's outputs, then lam's update (lam: when the page has the slider)
        and the cleared leftovers (`stale`)."""
        return (*self.outputs(), *([self.lam] if lam else []), *self.stale)


@dataclass
class View:
    fields: list  # (props, value) of every panel field (`panels.panel_fields`)
    reference: str  # the reference answer's Markdown (cached answers only)
    settings: str  # the settings string
    summary: dict  # the view's raw data (kept indices, timings)
    tokens: list  # the prompt's scored tokens, the heatmap's marked

    def outputs(self) -> tuple:
        """/view's outputs: full panel updates, then reference, settings, summary, tokens."""
        return (*P.panel_updates(self.fields), self.reference, self.settings, self.summary, self.tokens)


@dataclass
class Live:
    """The page's view: only what changed since its last one, and the follow-up counters; or, when the
    controls were refused, every output left as it is and the refusal's sentence in `notice`."""

    panels: list  # one update or bare value per panel field (`panels.live_updates`)
    reference: Any
    settings: Any
    shown: dict  # {"props": what the page now shows, "summary": the view's data, "refused": the notice is up}
    ask: Any  # the answers' counter (bumped when answering automatically)
    raw: Any  # the raw data's counter (bumped while its accordion is open)
    notice: Any = None  # the refusal line above the panels: its sentence, "" to clear it, or an empty update

    def outputs(self) -> list:
        return [*self.panels, self.reference, self.settings, self.shown, self.ask, self.raw, self.notice]


def refusal_md(sentence: str) -> str:
    """The refusal line's Markdown: the sentence, and that the panels still show the last settings drawn."""
    text = plain(sentence).replace("*", "\\*").replace("_", "\\_")
    return f"**Not applied:** {text[:1].upper()}{text[1:]}. The panels still show the last settings that worked."


@dataclass
class Answers:
    panels: list  # the answer field of every panel slot
    reference: str
    answers: dict  # {"reference": ..., "methods": {name: ...}}

    def outputs(self) -> tuple:
        return (*self.panels, self.reference, self.answers)


@dataclass
class Inspected:
    tokens: list  # (prompt token, its PMI with the patch scaled to [0, 1])
    info: dict  # where the patch is, which methods keep it, its PMI

    def outputs(self) -> tuple:
        return self.tokens, self.info


def _no_progress(*args, **kwargs) -> None:
    return None


def waiting(fn: Callable, progress: Callable | None, doing: str, estimate: float | None, every: float = 0.5):
    """fn() (its value or its error), telling `progress` every `every` s while it runs (in a thread of its own):
    the seconds so far, as a share of `estimate` (what the last such call took here) when there is one.
    progress None: fn() in this thread."""
    if progress is None:
        return fn()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="encode") as pool:
        job = pool.submit(contextvars.copy_context().run, fn)  # its context: the call's visitor (engine.visitor)
        while True:
            try:
                return job.result(timeout=every)
            except FutureTimeout:
                s = time.perf_counter() - t0
                last = f" (the last one here took {estimate:.0f} s)" if estimate else ""
                progress(min(s / estimate, 0.99) if estimate else None, desc=f"{doing}: {s:.0f} s{last}")


class Handlers:
    """The page's handlers around one `AppLogic` (shared by all sessions; no user state here)."""

    def __init__(self, logic: AppLogic, *, auto_answers: bool = True):
        self.logic = logic
        self.hint = "press Generate answers" if not auto_answers else "answers follow (or press Generate answers)"
        # decoder-layer parameters (the in-LLM methods' K) get the model's depth as their maximum
        self.layer_names = [n for n in C.control_names()[len(C.APP_FIELDS):] if n == "layer"]

    @staticmethod
    def settings(st, vals: dict) -> Settings:
        """Validated settings from the controls (a budget in tokens clamped to the encoding's size)."""
        return C.settings_from(*_ordered(vals), n_visual=st.n_visual if isinstance(st, UIState) else 0)

    def encode(self, st, media: Media, vals: dict, progress: Callable = _no_progress) -> Encoded:
        """Run the vision tower and embed the prompt; the budget, heat and layer controls follow the encoding."""
        name = media.model_name
        prev_frames = st.n_frames if isinstance(st, UIState) else 0  # the medium on screen before this Run
        doing = f"loading {name}" if name not in self.logic.hub.loaded else "encoding (vision tower + prompt)"
        progress(0.1, desc=doing)
        st, msg = waiting(lambda: self.logic.encode(st, name, media.use, media.image, media.video, media.prompt,
                                                    text_mode=vals["text_mode"], fewer_views=media.fewer_views),
                          None if self.logic.gpu is not None or progress is _no_progress else progress, doing,
                          self.logic.encode_s.get(name or self.logic.hub.default))
        progress(1.0, desc="encoded")
        unit, budget, heat = vals["unit"], vals["budget"], vals["heat"]
        heat = int(heat) if heat is not None and -1 <= int(heat) < len(st.tokens) else -1
        layers = ([gr.update(maximum=st.n_layers, value=min(int(vals[n] or 1), st.n_layers))
                   for n in self.layer_names] if st.n_layers else [gr.update() for _ in self.layer_names])
        auto = st.lam_auto is not None and str(vals.get("lam_rule")) == "auto"
        return Encoded(st, msg, token_chips(st.tokens, heat),
                       C.budget_slider(unit, st.n_visual, budget if unit == "%" else None, st.n_frames, prev_frames),
                       gr.update(value=heat),
                       layers, gr.update(value=st.lam_auto) if auto else gr.update(), P.cleared_patches())

    @staticmethod
    def lam_rule(st, rule) -> dict:
        """The lam slider under a lam rule: disabled under "auto" and showing the value it applies to the
        prompt on screen (once something is encoded); live under "fixed" at the value it shows."""
        props = C.lam_props(parameters()["lam"], rule)
        if str(rule) == "auto" and isinstance(st, UIState) and st.lam_auto is not None:
            props["value"] = st.lam_auto
        return gr.update(**props)

    def view(self, st, vals: dict, frame=0) -> View:
        """Prune with every chosen method and draw its panel (a video's `frame` alone when 1..n_frames, at the
        panel's width: `components.page.video`); answers already made for these settings fill the panels
        (never runs the LLM)."""
        s = self.settings(st, vals)
        views, summary = self.logic.view(st, s)
        box = self.frame_box(st, frame)
        if box is not None:
            V.show_frame(views, box)
        cached = self.logic.cached_answers(st, s)
        video = isinstance(st, UIState) and st.n_frames > 1
        return View(P.panel_fields(views, st.n_visual, cached, self.hint, video=video), P.reference_md(cached["reference"]),
                    s.to_string(), summary, token_chips(st.tokens, s.heat))

    def live(self, st, vals: dict, *, shown=None, ask=0, raw=0, raw_open=False, auto=False, frame=0) -> Live:
        """The view as the page gets it: props only where they changed since `shown`; `ask` bumped when
        answering automatically, `raw` while the raw data is open (each starts its own event)."""
        try:
            v = self.view(st, vals, frame)
        except UserError as e:  # the controls refused: a view event (outside the queue) shows no error of its own
            return self.refused(shown, str(e))
        except Exception:  # noqa: BLE001 - the traceback goes to the server log; the page gets a sentence
            log.exception("unexpected error while drawing the panels")
            return self.refused(shown, "something went wrong while drawing the panels (the server log has the details)")
        updates, props = P.live_updates(v.fields, (shown or {}).get("props"))
        bump = lambda n, yes: int(n or 0) + 1 if yes else n  # noqa: E731
        notice = "" if (shown or {}).get("refused") else gr.skip()  # clear a refusal once the panels follow again
        return Live(updates, v.reference, v.settings, {"props": props, "summary": v.summary}, bump(ask, auto),
                    bump(raw, raw_open), notice)

    @staticmethod
    def refused(shown, sentence: str) -> Live:
        """The page's view when its controls are refused: nothing redrawn, no answers or raw-data event, and the
        sentence in the refusal line (Gradio's page shows no error toast for an event outside the queue)."""
        keep = gr.skip()
        return Live([keep] * (P.PANEL_FIELDS * MAX_PANELS), keep, keep, {**(shown or {}), "refused": True}, keep,
                    keep, refusal_md(sentence))

    def generate(self, st, vals: dict, max_new_tokens=None, progress=None, *, bare: bool = False) -> Answers:
        """The unpruned reference answer and every panel's. bare: values only (the page's panels are shown)."""
        s = self.settings(st, vals)
        ans = self.logic.generate(st, s, int(max_new_tokens or self.logic.max_new_tokens), progress=progress)
        return Answers(P.answer_updates(list(s.methods), ans, self.hint, bare=bare), P.reference_md(ans["reference"]),
                       ans)

    def stream(self, st, vals: dict, max_new_tokens=None, *, bare: bool = False) -> Iterator[Answers]:
        """`generate`'s answers as they come (on a CPU: the pruned ones first, the unpruned last, each one's
        text while it decodes; `AppLogic.stream_answers`): one Answers after every change."""
        s = self.settings(st, vals)
        methods = list(s.methods)
        for rec in self.logic.stream_answers(st, s, int(max_new_tokens or self.logic.max_new_tokens)):
            ans = rec.as_dict()
            yield Answers(P.answer_updates(methods, ans, self.hint, bare=bare, partial=rec.partial),
                          P.reference_md(ans["reference"], rec.partial.get(None)), ans)

    @staticmethod
    def encoded(st) -> bool:
        """Whether the session has an encoding on screen (answers have something to answer about)."""
        return isinstance(st, UIState) and st.key is not None

    @staticmethod
    def no_answers() -> Answers:
        """The answers' outputs before anything is encoded: empty slots, "not generated yet"."""
        return Answers([None] * MAX_PANELS, P.reference_md(None), None)

    def inspect(self, st, vals: dict, x, y) -> Inspected:
        """The patch under (x, y): its PMI with every prompt token, scaled to [0, 1] for the page."""
        s = self.settings(st, vals)
        if x is None or y is None:
            raise UserError("give the x and y of a patch (or click one)")
        info = self.logic.inspect(st, s, float(x), float(y))
        pmi = [v for _, v in info["pmi"]]
        lo, hi = min(pmi), max(pmi)
        return Inspected([(t, round((v - lo) / (hi - lo), 3) if hi > lo else 0.5) for t, v in info["pmi"]], info)

    def frame_box(self, st, frame) -> tuple[int, int, int, int] | None:
        """The picked frame's box in the panels' picture (frames in a grid), or None (every frame shown)."""
        if frame and isinstance(st, UIState) and 0 < int(frame) <= st.n_frames:
            return self.logic.frame_box(st, int(frame) - 1)
        return None

    def click(self, st, frame, x, y) -> tuple:
        """The clicked pixel in the whole picture's coordinates (a video's frames in a grid; one frame
        picked: inside its box, its enlargement undone)."""
        return V.grid_point(self.frame_box(st, frame), x, y)

    @staticmethod
    def frame_range(st) -> dict:
        """The frame selector: shown for a video of several frames, reset to 0 (every frame)."""
        n = st.n_frames if isinstance(st, UIState) else 0
        return gr.update(visible=n > 1, maximum=max(n, 1), value=0)

    @staticmethod
    def token(st, index) -> int:
        """The heatmap token for a click on the prompt's token `index` (-1 when out of range)."""
        idx = index if isinstance(index, int) else index[0]
        return idx if isinstance(st, UIState) and 0 <= idx < len(st.tokens) else -1

    def export(self, st, vals: dict) -> list[str]:
        """PNG and JSON files of the view, in a fresh folder."""
        return self.logic.export(st, self.settings(st, vals), self.logic.new_export_dir())

    @staticmethod
    def apply(st, settings: str | None) -> dict:
        """The controls set to a settings string (by name; the budget as the slider's update for its unit)."""
        try:
            s = Settings.parse(settings or "")
            check_methods(s.methods)  # what /view takes
        except (ValueError, UserError) as e:
            raise UserError(plain(e)) from None
        n_v = st.n_visual if isinstance(st, UIState) else 0
        vals = controls_for(s, n_v)
        return {**vals, "budget": C.budget_slider(vals["unit"], n_v, vals["budget"])}

    @staticmethod
    def chips(st, heat) -> list:
        return token_chips(st.tokens if isinstance(st, UIState) else [], int(-1 if heat is None else heat))

    @staticmethod
    def unit(st, unit: str) -> dict:
        """The budget slider's range after a switch of unit (its default value)."""
        return C.budget_slider(unit, st.n_visual if isinstance(st, UIState) else 0)


__all__ = ["ENCODE_FIELDS", "Answers", "Encoded", "Handlers", "Inspected", "Live", "Media", "View", "controls_for",
           "controls_of", "refusal_md", "token_chips"]
