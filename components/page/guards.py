"""Gradio hooks that keep every message on the page plain.

Gradio shows a handler's `gr.Error` as it is, but any other exception, including one raised while
it turns an input into a Python value (PIL refusing a decompression bomb, a text file named .png,
NaN in a whole-number box), becomes its generic "the upstream Gradio app has raised an exception".
`guard_inputs` makes each input's conversion failures a `gr.Error` that names the input;
`plain_errors` does the same for the handlers: a `UserError` shows its message, anything else is
logged with its traceback on the server and shown as a plain sentence.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import re

import gradio as gr

from ..core.logic import UserError
from ..core.messages import input_problem, plain, short

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)

log = logging.getLogger("mipruner.app")


def _kind(component) -> str:
    if isinstance(component, gr.Image):
        return "image"
    if isinstance(component, gr.Video):
        return "video"
    return type(component).__name__.lower()


def guard_inputs(components: dict, blocks: gr.Blocks | None = None) -> None:
    """Make a failure to convert any input of `blocks` (default: the Blocks being built) a plain
    gr.Error naming the input (`components`: name -> component, for the names).

    Gradio builds the message of such a failure in `Blocks._format_processing_error`, called from
    inside its `except` around the component's `preprocess`; this Blocks' copy of it raises the
    plain gr.Error instead (Gradio passes a gr.Error on as it is). A hook on the Blocks rather than
    on each component: Gradio rebuilds a component for the session when a handler updates it."""
    blocks = blocks or gr.context.Context.root_block
    if blocks is None:
        raise RuntimeError("guard_inputs needs the Blocks: call it inside `with gr.Blocks()` or pass blocks=")
    names = {c._id: n for n, c in components.items()}

    def format_error(block_fn, index, block, value, is_input, original_error):
        comp = (block_fn.inputs if is_input else block_fn.outputs)[index]
        if not is_input:
            log.error("could not show the result in %s", type(comp).__name__, exc_info=original_error)
            raise gr.Error("Something went wrong while showing the result; the server log has the details.",
                           print_exception=False)
        name = names.get(comp._id) or getattr(comp, "label", None) or "an input"
        raise gr.Error(input_problem(name, _kind(comp), value, original_error), print_exception=False)

    blocks._format_processing_error = format_error
    original = blocks.preprocess_data

    async def preprocess_data(block_fn, inputs, state, explicit_call=False):
        """Gradio's own checks of a payload (a file's path, a choice, a number's range) run outside the hook
        above or raise its own wording: the same checks run here first, each failure a sentence naming the
        input; anything else Gradio refuses while reading the inputs becomes a plain sentence too."""
        for i, comp in enumerate(block_fn.inputs):
            if getattr(comp, "stateful", False) or i >= len(inputs):
                continue
            current = state[comp._id] if state is not None and comp._id in state else comp
            name = names.get(comp._id) or getattr(comp, "label", None) or "an input"
            problem = payload_problem(name, current, inputs[i])
            if problem:
                raise gr.Error(problem, print_exception=False)
        try:
            return await original(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception:  # noqa: BLE001 - e.g. a file path Gradio may not serve: logged, not shown
            log.warning("an input could not be read", exc_info=True)
            raise gr.Error("An input file could not be read: upload the file (gradio_client: handle_file) and try "
                           "again.", print_exception=False) from None

    blocks.preprocess_data = preprocess_data


def _choices(comp) -> list:
    return [c[1] if isinstance(c, (tuple, list)) else c for c in (getattr(comp, "choices", None) or [])]


def payload_problem(name: str, comp, payload) -> str | None:
    """Why `payload` (as sent, before Gradio reads it) cannot be the input `name` (a component), or None."""
    if payload is None:
        return None
    if isinstance(comp, (gr.Image, gr.Video, gr.File)):
        for p in payload if isinstance(payload, list) else [payload]:
            path = p.get("path") if isinstance(p, dict) else p if isinstance(p, str) else None
            url = p.get("url") if isinstance(p, dict) else None
            if (isinstance(path, str) and _URL.match(path)) or (not path and url):
                return (f"{name}: this server does not fetch files from the web; upload the file instead "
                        "(gradio_client: handle_file with a local path)")
            if isinstance(path, str) and path and not os.path.isfile(path):
                return (f"{name}: the file {short(os.path.basename(path), 40)} was never uploaded to this server; "
                        "upload it first (gradio_client: handle_file)")
        return None
    dropdown_free = isinstance(comp, gr.Dropdown) and getattr(comp, "allow_custom_value", False)
    if isinstance(comp, (gr.Radio, gr.CheckboxGroup, gr.Dropdown)) and not dropdown_free:
        choices = _choices(comp)
        for v in payload if isinstance(payload, list) else [payload]:
            if v not in choices:
                listed = ", ".join(str(c) for c in choices)
                return f"{name}: {short(v, 40)} is not one of its choices ({listed[:300]})"
        return None
    if isinstance(comp, (gr.Slider, gr.Number)) and isinstance(payload, (int, float)) and not isinstance(payload, bool):
        lo, hi = comp.minimum, comp.maximum
        if not math.isfinite(payload):
            return f"{name} must be a finite number, got {payload}"
        if ((lo is not None and payload < lo) or (hi is not None and payload > hi)):
            span = f"in [{lo:g}, {hi:g}]" if lo is not None and hi is not None else (
                f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
            return f"{name} must be {span}, got {payload:g}"
    return None


def plain_errors(doing: str):
    """Handler decorator: UserError -> its message; any other exception -> logged, plain message."""
    def wrap(fn):
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except gr.Error:
                raise
            except UserError as e:
                raise gr.Error(plain(e), print_exception=False) from None
            except Exception:  # noqa: BLE001 - the traceback goes to the server log, not to the page
                log.exception("unexpected error while %s", doing)
                raise gr.Error(f"Something went wrong while {doing}. Try again, or try another file or setting; "
                               "the server log has the details.", print_exception=False) from None

        return handler

    return wrap


__all__ = ["guard_inputs", "payload_problem", "plain_errors"]
