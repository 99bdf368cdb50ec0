"""What each of the page's events does with its values, by name: `Calls` reads an event's values (a dict
by the API's parameter names, `state` first) into a handler's arguments (`components.page.handlers`)
and lists its outputs in the event's order; `event` makes the function Gradio calls from a call and
the names of its inputs.

Gradio calls an event's function with positional values in the order of its inputs, and injects
gr.Progress positionally, as the last argument: `event` names them once (`named` gives the API's
functions these parameter names, so `gradio_client`'s view_api shows them), so no call slices its
arguments by position. The controls come either one input each (the API: their names,
`controls.control_names()`) or boxed in one value, `controls` (the page's events: `controls.BOX_JS`);
`controls` reads either.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable

import gradio as gr

from mipruner.serve.service import Busy, visitor

from ..core.kept import Kept, kept_in
from ..core.logic import UserError
from . import controls as C
from .guards import plain_errors
from .handlers import ENCODE_FIELDS, Handlers, Media, controls_of

PROGRESS = (inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()),)
# Gradio injects the request (by annotation, never an API input): a plain event takes the model's turns as its
# connection (`mipruner.serve.service.visitor`), so one client's calls share one line and one cap
MAX_CALLS = 3  # model calls one connection may have under way (one running, two waiting: the engine's cap)
REQUEST = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request)
_END = object()


@contextlib.contextmanager
def _shown():
    """A handler's UserError as the page's error (its message as it is)."""
    try:
        yield
    except (UserError, Busy) as e:  # Busy: a connection's surplus model call (`visitor`)
        raise gr.Error(str(e), print_exception=False) from None


def named(*names: str, extra: tuple = ()):
    """Give a `*vals` handler a signature with these parameter names, so the API (and
    `gradio_client`'s view_api) shows readable names instead of param_1, param_2, ..."""
    def wrap(fn):
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        params += list(extra)
        fn.__signature__ = inspect.Signature(params)
        return fn

    return wrap


def streamed(doing: str):
    """`plain_errors` for a generator handler (an event whose outputs stream): every step's error as the page's
    sentence."""
    def wrap(fn):
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            steps = fn(*args, **kwargs)  # a generator: nothing runs before the first step
            step = plain_errors(doing)(lambda: next(steps, _END))
            while (out := step()) is not _END:
                yield out

        return handler

    return wrap


def _session(request) -> str | None:
    return getattr(request, "session_hash", None)


def event(call: Callable[[dict], object], doing: str, *names: str, progress: bool = False, capped: bool = False,
          kept: Kept | None = None):
    """The function an event runs, named after `call` (on_<its name>): its positional values named `names` (and
    `progress`, injected by Gradio) handed to `call` as one dict; a generator call streams its outputs.
    doing: what the error sentence says was under way. capped (a call that runs the model): refused at once, with a
    sentence, when its connection has MAX_CALLS such calls under way. kept: the app's own record of encoded
    sessions (`components.core.kept`): a `state` Gradio dropped from its store is found again by the session's
    hash, and an encoded state among the outputs is noted there."""
    extra = (*(PROGRESS if progress else ()), REQUEST)
    keys = [*names, *(p.name for p in extra)]

    def values(vals) -> tuple[dict, str | None]:
        v = dict(zip(keys, vals, strict=True))
        session = _session(v.pop(REQUEST.name))
        if kept is not None and "state" in v:
            v["state"] = kept.state(session, v["state"])
        return v, session

    if inspect.isgeneratorfunction(call):
        def steps(*vals):
            v, _ = values(vals)
            with _shown():
                yield from call(v)
        fn, guard = steps, streamed(doing)
    else:
        def run(*vals):
            v, session = values(vals)
            with _shown():
                with visitor(session, MAX_CALLS if capped else None):
                    out = call(v)
            if kept is not None:
                kept.keep(session, kept_in(out))
            return out
        fn, guard = run, plain_errors(doing)
    fn.__annotations__ = {REQUEST.name: gr.Request}  # Gradio finds gr.Request by annotation
    fn.__name__ = fn.__qualname__ = f"on_{call.__name__}"
    return guard(named(*names, extra=extra)(fn))


def controls(v: dict) -> dict:
    """The control values by name: from the page's box (`controls`) or from the API's one input each."""
    if "controls" in v:
        return controls_of(C.unbox(v["controls"]))
    return controls_of([v[n] for n in C.control_names()])


class Calls:
    """The events' calls around one `Handlers`: each takes its event's values by name (see `event`)."""

    def __init__(self, handlers: Handlers, *, lam: bool):
        self.H = handlers
        self.lam = lam  # the page has the lam slider (its encode event sets it under lam_rule "auto")

    def _encoded(self, v: dict):
        media = Media.of(*(v[n] for n in ENCODE_FIELDS))
        media.fewer_views = v.get("fewer_views")  # the page's box; /encode leaves it to the app's default
        return self.H.encode(v["state"], media, controls(v), v.get("progress") or (lambda *a, **k: None))

    def encode(self, v: dict) -> tuple:
        """/encode: state, status, prompt tokens, the budget, heat and layer controls' updates."""
        return self._encoded(v).outputs()

    def page_encode(self, v: dict) -> tuple:
        """The page's Run: /encode's outputs, the lam slider under "auto", the last clicks forgotten."""
        return self._encoded(v).page_outputs(lam=self.lam)

    def view(self, v: dict) -> tuple:
        """/view: every panel in full (visibility, labels, values), reference, settings, summary, tokens."""
        return self.H.view(v["state"], controls(v)).outputs()

    def live(self, v: dict) -> list:
        """The page's view: only what changed since its last one (`Handlers.live`); frame: a video's frame."""
        return self.H.live(v["state"], controls(v), shown=v["shown"], ask=v["ask"], raw=v["raw"],
                           raw_open=v["raw_open"], auto=v["auto"], frame=v.get("frame") or 0).outputs()

    def generate(self, v: dict) -> tuple:
        """/generate: every answer at once."""
        return self.H.generate(v["state"], controls(v), v["max_new_tokens"], v.get("progress")).outputs()

    def stream(self, v: dict):
        """The page's Generate: the answers as they come (`Handlers.stream`)."""
        for answers in self.H.stream(v["state"], controls(v), v["max_new_tokens"]):
            yield answers.outputs()

    def auto(self, v: dict):
        """Answers after a view that asked for them, as they come (its panels are shown: bare values, no prop
        updates), and the view's raw data."""
        summary = (v["shown"] or {}).get("summary")
        if not self.H.encoded(v["state"]):
            yield (*self.H.no_answers().outputs(), None)
            return
        for answers in self.H.stream(v["state"], controls(v), v["max_new_tokens"], bare=True):
            yield (*answers.outputs(), summary)

    def inspect(self, v: dict) -> tuple:
        return self.H.inspect(v["state"], controls(v), v["x"], v["y"]).outputs()

    def export(self, v: dict) -> list[str]:
        return self.H.export(v["state"], controls(v))

    def apply(self, v: dict) -> tuple:
        """/settings: the controls set to the settings string, in their order."""
        vals = self.H.apply(v["state"], v["settings"])
        return tuple(vals[n] for n in C.control_names())

    def click(self, st, frame, evt: gr.SelectData) -> tuple:
        """A click on a panel's picture: its point in the whole strip (Gradio passes the event by its type)."""
        with _shown():
            return self.H.click(st, frame, *evt.index)

    def token(self, st, evt: gr.SelectData) -> int:
        return self.H.token(st, evt.index)


__all__ = ["Calls", "PROGRESS", "controls", "event", "named", "streamed"]
