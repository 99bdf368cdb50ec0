"""The answers as the page shows them, without Gradio: an answer's record (`answer_dict`), the answers'
record of one view (`Record`) and their stream (`stream`).

`stream` answers one panel at a time, the pruned ones first (each reads a fraction of the visual tokens:
seconds where the unpruned answer takes half a minute on a CPU) and the unpruned reference last, and
reports each answer's text while it decodes: a logits processor (`TokensSoFar`: it returns the scores it
is given, so the answer is the one a plain call gives, and it is cached as such) hands the tokens so far
to the caller's thread, at most every STREAM_EVERY_S (one host transfer each). The decoding runs in a
thread of its own; the caller's generator reads its reports from a queue of this call alone, so two
sessions never see each other's answers. Each answer's time is its own (`own_timing`: one answer per
call here). The reader waits at most HEARTBEAT_S for a report, then yields the record as it stands: a server
closes a stream only between two of its steps (Gradio retries `close()` while a step runs), so a page that
went away stops its decoding within one heartbeat plus one model step, even while the answer waits for the
model or an in-LLM method decodes without reports.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from mipruner.serve.answer_time import own_timing
from mipruner.serve.service import method_spec

from .messages import plain

STREAM_EVERY_S = 0.25  # the page's answers are redrawn at most this often while a model decodes
HEARTBEAT_S = 1.0  # the reader yields at least this often, so that closing the stream lands between its steps


def answer_dict(ans) -> dict:
    """An `Answer` as the page and the API report it: text, input sizes, its own timing, new tokens."""
    out = {"text": ans.text, "input_tokens": ans.input_tokens, "visual_tokens": ans.visual_tokens,
           **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in own_timing(ans).items()},  # its own share
           "new_tokens": len(ans.token_ids)}
    read = getattr(ans, "decode_visual", None)  # a decode-time stage's visual keys read per step (DyCoke)
    if read:
        out["decode_visual"] = round(sum(read) / len(read), 1)
        out["decode_layer"] = int(ans.decode_layer)
    return out


@dataclass
class Record:
    """The answers of one view as far as they go: {"reference": ..., "methods": {name: ...}} (`as_dict`,
    what /generate returns), plus the text decoded so far of the answers not finished (`partial`: the
    method's name, None for the reference)."""

    reference: dict | None = None
    methods: dict = field(default_factory=dict)
    partial: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"reference": self.reference, "methods": dict(self.methods)}

    def put(self, method: str | None, entry: dict) -> None:
        self.partial.pop(method, None)
        if method is None:
            self.reference = entry
        else:
            self.methods[method] = entry


class Stopped(Exception):
    """The stream's reader went away (the page started another event): the answer under way is dropped."""


class TokensSoFar:
    """A logits processor that reports the tokens decoded so far of the first row to `report(ids)`, at most
    every `every` seconds, and returns the scores unchanged; raises Stopped once `stop` is set. It sees the
    ids before each step's pick: the prompt's ids (if the model is fed them), then the new ones; the length
    at its first call is the prompt's."""

    def __init__(self, report: Callable[[list[int]], None], stop: threading.Event, every: float = STREAM_EVERY_S):
        self.report, self.stop, self.every = report, stop, every
        self.start: int | None = None
        self.last = time.perf_counter()

    def __call__(self, ids, scores):
        if self.stop.is_set():
            raise Stopped
        if self.start is None:
            self.start = int(ids.shape[1])
        now = time.perf_counter()
        if now - self.last >= self.every and ids.shape[1] > self.start:
            self.last = now
            self.report(ids[0, self.start:].tolist())  # the one transfer of a report
        return scores


def order(methods) -> list:
    """The answers' order: every panel's method as the panels show them, the unpruned reference (None) last."""
    return [*methods, None]


def stream(engine, session, key, methods, budget, params: dict, max_new_tokens: int, *,
           guard: Callable, errors: tuple = ()) -> Iterator[Record]:
    """The answers one by one (`order`), each reported while it decodes; yields the Record after every change.
    guard(): the caller's context that turns what went wrong into its own error; one of `errors` stops the
    stream and is raised to the reader, any other exception of one answer stands as that answer's sentence.
    Closing the generator stops the decoding at its next step."""
    record, reports, stop = Record(), queue.Queue(), threading.Event()
    decode = getattr(getattr(engine.adapter, "tokenizer", None), "decode", None)

    def one(m):
        watch = []
        if decode is not None and (m is None or method_spec(m).stage != "llm"):  # in-LLM: its own loop, no hook
            watch = [TokensSoFar(lambda ids: reports.put(("partial", m, ids)), stop)]
        try:
            with guard():
                ans = engine.generate(session, key, m, budget, params, max_new_tokens=max_new_tokens,
                                      **({"logits_processor": watch} if watch else {}))
            return answer_dict(ans)
        except (Stopped, *errors):
            raise
        except Exception as e:  # noqa: BLE001: a method may raise anything; it costs only its own answer
            return {"error": plain(e)}

    def run():
        try:
            for m in order(methods):
                if stop.is_set():
                    return
                reports.put(("done", m, one(m)))
            reports.put(("end", None, None))
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001: the request's error, raised in the reader's thread
            reports.put(("raise", None, e))

    threading.Thread(target=run, name="answers", daemon=True).start()
    try:
        new = False  # a change not yielded yet
        while True:
            try:
                kind, m, got = reports.get(timeout=HEARTBEAT_S)
            except queue.Empty:  # nothing new: a step all the same, where a closed page's close() lands
                yield record
                continue
            if kind == "end":
                if new:
                    yield record
                return
            if kind == "raise":
                raise got
            if kind == "partial":
                record.partial[m] = decode(got, skip_special_tokens=True)
            else:
                record.put(m, got)
            new = True
            if reports.empty():  # reports that came meanwhile are drawn once
                new = False
                yield record
    finally:
        stop.set()


__all__ = ["HEARTBEAT_S", "STREAM_EVERY_S", "Record", "Stopped", "TokensSoFar", "answer_dict", "order", "stream"]
