"""A broken method costs its own result, not everyone's: one sentence per failure, and the guarded calls
the app, eval, sweeps and the lmms-eval model make for each method.

    sel, why = guarded("center", lambda: mipruner.select(adapter, enc, "center", 64))
    # sel is None and `why` is "'center' failed: RuntimeError: boom" when the method raised

A plug-in that breaks the selection contract (`ContractError`) already says so in one sentence; any other
exception is reduced to its type and the first line of its message. KeyboardInterrupt and SystemExit are
never caught.

A selection that cannot be drawn (`drawing`, around a panel's drawing) is the same: a `DrawingError`, one
sentence in its own panel, never the view's error, whatever the drawing raised (a built-in's ValueError
included, which `request_errors` would otherwise make the request's).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator, TypeVar

from ..pruners._registry import ContractError
from ..pruners.video import NotApplicable

T = TypeVar("T")
log = logging.getLogger("mipruner.serve.failures")


class DrawingError(RuntimeError):
    """A method chose its tokens but its panel could not be drawn: costs that panel only."""


@contextlib.contextmanager
def drawing(method: str) -> Iterator[None]:
    """Around the drawing of `method`'s panel: any Exception becomes a `DrawingError` (logged with its
    traceback), so the method's panel shows one sentence and the view goes on with the others."""
    try:
        yield
    except DrawingError:
        raise
    except Exception as exc:  # noqa: BLE001: a drawing may fail anyhow; it costs only its own panel
        log.warning("the panel of %r could not be drawn", method, exc_info=True)
        raise DrawingError(f"{method!r} chose its tokens, but its panel could not be drawn "
                           "(the server log has the details)") from exc


def sentence(method: str | None, exc: BaseException) -> str:
    """One line saying that `method` failed and why."""
    if isinstance(exc, (ContractError, DrawingError)):
        return str(exc).splitlines()[0]
    if isinstance(exc, NotApplicable):  # a video method on an image: not a failure, a fact about the input
        return f"{method!r} does not apply here: {(str(exc).strip().splitlines() or [''])[0]}"
    text = (str(exc).strip().splitlines() or [""])[0]
    what = f"{method!r}" if method else "the unpruned answer"
    return f"{what} failed: {type(exc).__name__}{': ' + text if text else ''}"


def guarded(method: str | None, fn: Callable[[], T], reraise: tuple = ()) -> tuple[T | None, str | None]:
    """(fn(), None), or (None, the sentence) when fn raises an Exception other than those in `reraise`; a
    `NotApplicable` (a video method on an image) always costs only its own result."""
    try:
        return fn(), None
    except NotApplicable as exc:
        return None, sentence(method, exc)
    except reraise:
        raise
    except Exception as exc:  # noqa: BLE001: a method may raise anything; it costs only its own result
        return None, sentence(method, exc)


def request_errors(method: str) -> tuple:
    """What stays the request's error when `method` raises it in the app: a built-in's ValueError says the
    settings do not fit this input (a layer past the model's depth, say), as before; a plug-in's every
    exception costs only its own panel."""
    from ..pruners._registry import get_pruner

    return () if get_pruner(method).origin else (ValueError,)


__all__ = ["DrawingError", "drawing", "guarded", "request_errors", "sentence"]
