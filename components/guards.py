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

import gradio as gr

from .logic import UserError
from .messages import input_problem, plain

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


__all__ = ["guard_inputs", "plain_errors"]
