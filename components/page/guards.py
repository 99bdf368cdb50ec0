"""Gradio hooks that keep every message on the page plain.

Gradio shows a handler's `gr.Error` as it is, but any other exception, including one raised while
it turns an input into a Python value (PIL refusing a decompression bomb, a text file named .png,
NaN in a whole-number box), becomes its generic "the upstream Gradio app has raised an exception".
`guard_inputs` makes each input's conversion failures a `gr.Error` that names the input;
`plain_errors` does the same for the handlers: a `UserError` shows its message, anything else is
logged with its traceback on the server and shown as a plain sentence.

`guard_inputs` is also the one place where every event's file inputs are checked, whatever the payload's
shape (`components.core.file_access`): a request opens only files in Gradio's upload cache or the app's
assets, and a missing file and one outside those folders get the same sentence.
"""
from __future__ import annotations

import functools
import logging
import math

import gradio as gr

from ..core.file_access import ASSETS_DIR, file_problem, real_roots
from ..core.logic import UserError
from ..core.messages import input_problem, plain, short

# every component whose payload names files on the server
FILE_INPUTS = tuple(getattr(gr, n) for n in ("Image", "Video", "File", "Gallery", "Audio", "Model3D", "UploadButton",
                                             "ImageEditor", "MultimodalTextbox", "ImageSlider") if hasattr(gr, n))

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
        roots = file_roots(blocks)
        for i, comp in enumerate(block_fn.inputs):
            if getattr(comp, "stateful", False) or i >= len(inputs):
                continue
            current = state[comp._id] if state is not None and comp._id in state else comp
            name = names.get(comp._id) or getattr(comp, "label", None) or "an input"
            problem = payload_problem(name, current, inputs[i], roots)
            if problem:
                raise gr.Error(problem, print_exception=False)
        try:
            return await original(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception:  # noqa: BLE001 - e.g. a file path Gradio may not serve: logged, not shown
            log.warning("an input could not be read", exc_info=True)
            files = [names.get(c._id) or getattr(c, "label", None) or "a file input"
                     for c, v in zip(block_fn.inputs, inputs) if isinstance(c, FILE_INPUTS) and v is not None]
            raise gr.Error(f"{files[0] if len(files) == 1 else 'An input file'}: it could not be read; upload the file "
                           "(gradio_client: handle_file) and try again.", print_exception=False) from None

    blocks.preprocess_data = preprocess_data


def file_roots(blocks=None) -> tuple[str, ...]:
    """The folders a request's files may be in, as real paths: Gradio's upload cache (the folder its
    upload route writes to, and the one `GRADIO_TEMP_DIR` names now) and the app's assets."""
    from gradio.utils import get_upload_folder

    app = getattr(blocks, "server_app", None)
    return real_roots([getattr(app, "uploaded_file_dir", None), get_upload_folder(), ASSETS_DIR])


def _choices(comp) -> list:
    return [c[1] if isinstance(c, (tuple, list)) else c for c in (getattr(comp, "choices", None) or [])]


def payload_problem(name: str, comp, payload, roots=None) -> str | None:
    """Why `payload` (as sent, before Gradio reads it) cannot be the input `name` (a component), or None.
    roots: the folders a file may be in (`file_roots`; default: those of the running app)."""
    if payload is None:
        return None
    if isinstance(comp, FILE_INPUTS):
        return file_problem(name, payload, file_roots() if roots is None else roots)
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


__all__ = ["FILE_INPUTS", "file_roots", "guard_inputs", "payload_problem", "plain_errors"]
