"""What the Sweep area does, without Gradio: build a sweep from the page, run it with progress and
cancel, keep finished sweeps per session (re-plotting reads them), draw curves, write downloads,
and the strip of kept-patch masks across the swept values for the image on screen.

The sweep itself is the library's (`mipruner.eval.sweep`, run on the engine's model under its lock):
each item is encoded once and every method x value reuses that encoding. Cancelling is keyed by the
browser session (`cancel(session_id)`), so it works whatever Gradio does with the state object.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from mipruner import viz
from mipruner.serve.service import TEXT_MODES, method_spec, parameters
from mipruner.eval import sweep as sweeps

from .logic import UIState, UserError, user_errors
from .messages import plain, short
from .sweep_queue import (ITEMS, Deadline, Pace, SweepLimits, SweepQueue, ZipSet, kinds_of, minutes, opened, steps_line,
                          steps_of)

MAX_ITEMS = SweepLimits().max_items  # a local app's sweep: at most this many questions (hosted: SweepLimits)
MAX_VALUES = 12
MAX_STRIP_METHODS = 4
CACHE_ENTRIES = 6  # finished sweeps kept per session
THUMB = 150  # px: height of one mask in the strip
SETS = (*sweeps.GENERATED, "my own (zip)")
_RUNNING: dict[str, threading.Event] = {}  # session id -> its running sweep's stop flag
_RUNNING_LOCK = threading.Lock()


@dataclass
class SweepState:
    """One session's finished sweeps (most recent last) and which one is on screen."""

    results: OrderedDict = field(default_factory=OrderedDict)
    last: str | None = None

    def current(self):
        return self.results.get(self.last) if self.last else None

    def keep(self, key: str, result) -> None:
        self.results[key] = result
        self.results.move_to_end(key)
        self.last = key
        while len(self.results) > CACHE_ENTRIES:
            self.results.popitem(last=False)


def param_choices() -> list[tuple[str, str]]:
    """(label, name) of everything a sweep can vary: budget, text mode, every registered parameter."""
    out = [("budget (tokens kept)", "budget"), ("text_mode (prompt tokens scored)", "text_mode")]
    for name, p in parameters().items():
        out.append((f"{name}: {p.doc}"[:90], name))
    return out


def default_values(param: str) -> str:
    """Values to start from for `param` (the user edits them)."""
    if param == "budget":
        return "4,8,16,32,64"
    if param == "text_mode":
        return ",".join(TEXT_MODES)
    p = parameters()[param]
    if p.kind == "choice":
        return ",".join(str(c) for c in p.choices)
    if p.name == "lam":
        return "0,0.25,0.5,0.75,1"
    if p.name == "tau":
        return "0.01,0.05,0.1,0.5"
    lo = p.low if p.low is not None else 0
    hi = p.high if p.high is not None else max(1, 4 * (p.default or 1))
    if p.kind == "int":
        return ",".join(str(v) for v in sorted({int(v) for v in np.linspace(max(lo, 1 if p.low_open else lo), hi, 4)}))
    pts = np.linspace(lo, hi, 5)[1 if p.low_open else 0:None if not getattr(p, "high_open", False) else -1]
    return ",".join(f"{v:g}" for v in pts)


# the Sweep area's fields by their labels on the page (components/page/sweep.py): what a sentence names
METHODS, VALUES, BUDGET, QUESTION_SET = "Methods", "Values", "Budget when another parameter is swept", "Question set"


@contextlib.contextmanager
def _field(label: str):
    """A ValueError in the block (a value the library refused) as one sentence naming the field `label`."""
    try:
        yield
    except (ValueError, TypeError, OverflowError) as e:
        raise UserError(f"{label}: {plain(e)}") from None


def _not_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


def check_values(param: str, values: str) -> None:
    """UserError naming Values when `values` ("a,b,c") are not values of `param`."""
    if param == "budget":
        bad = next((t.strip() for t in str(values or "").split(",") if t.strip() and _not_a_number(t.strip())), None)
        if bad is not None:
            raise UserError(f"{VALUES}: {short(bad, 20)} is not a number (budgets are token counts, or shares in "
                            "(0, 1])")
    if param in sweeps.sweepable():
        with _field(VALUES):
            sweeps.parse_values(param, values or "")


def make_sweep(methods, param: str, values: str, budget, page_params: dict, text_mode: str,
               max_new_tokens: int) -> "sweeps.Sweep":
    """The sweep from the area's fields and the page's settings (parameters left at their defaults
    are not fixed, so the paper's lambda rule and Random's three seeds apply). A field's bad value is
    one sentence that names the field by its label."""
    methods = tuple(methods or ())
    if not methods:
        raise UserError(f"{METHODS}: choose at least one method to sweep")
    check_values(param, values)
    budget = budget if budget else 16
    if param != "budget":
        if isinstance(budget, str) and _not_a_number(budget):
            raise UserError(f"{BUDGET}: {short(budget, 20)} is not a number")
        with _field(BUDGET):
            sweeps.parse_value("budget", budget)
    defaults = {n: p.default for n, p in parameters().items()}
    fixed = {k: v for k, v in page_params.items() if k != param and v != defaults.get(k)}
    if param == "lam":
        fixed.pop("lam_rule", None)  # sweeping lam means lam as given
    with user_errors("preparing the sweep", ""):
        sw = sweeps.Sweep(methods=methods, param=param, values=values or "", budget=budget,
                          params=fixed, text_mode=text_mode if param != "text_mode" else "question",
                          max_new_tokens=int(max_new_tokens or 8))
    if len(sw.values) > MAX_VALUES:
        raise UserError(f"{VALUES}: at most {MAX_VALUES} values in the app (the headless command takes any number)")
    return sw


@contextlib.contextmanager
def question_set(name: str, n, seed, zip_path: str | None = None, questions: str | None = None, *,
                 limits: SweepLimits = SweepLimits(), files=None):
    """(items, description) of a generated set, or of the user's zip (+ optional JSONL), for the block. A zip is
    checked here (its questions, its media's size against the caps) but not unpacked: its items are a `ZipSet`,
    unpacked by `opened` when its sweep starts (`run`: after its wait in the queue), so a waiting sweep holds
    no disk."""
    try:
        n = int(n or 0)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{ITEMS} must be a whole number") from None
    if not 1 <= n <= limits.max_items:
        raise UserError(f"{ITEMS} must be in [1, {limits.max_items}] on this server, got {n}")
    if name != SETS[-1]:
        if name not in sweeps.GENERATED:
            raise UserError(f"{QUESTION_SET} must be one of {', '.join(SETS)}, got {str(name)[:40]!r}")
        with user_errors("reading the question set", "use a smaller set"):
            items = sweeps.generated_set(name, n=n, seed=int(seed or 0))
        yield items, f"{name} (seed {int(seed or 0)})"
        return
    if not zip_path:
        raise UserError("upload a zip of images/videos with questions.jsonl (format in docs/sweeps.md)")
    with user_errors("reading the question set", "use a smaller set"):
        size = sweeps.media_bytes(zip_path, questions or None, n)
        kinds = tuple(sweeps.zip_kinds(zip_path, questions or None, n))
    pending = ZipSet(str(zip_path), questions or None, n, size, kinds, limits, files)
    with pending.held():  # fits now (else refused at once); held again when it starts
        pass
    yield pending, os.path.basename(str(zip_path))[:60]


def cache_key(model: str, set_name: str, items: list, sw) -> str:
    return f"{model}|{set_name}|{len(items)}|{sw.key()}"


def run(state: SweepState, engine, sw, items: list, set_name: str, session_id: str, *,
        limits: SweepLimits = SweepLimits(), pace: Pace | None = None, queue: SweepQueue | None = None):
    """Run (or fetch from this session's cache) a sweep; yields ("waiting", place) while it waits for the
    queue, ("progress", done, total) per item, then ("done", result, cached). A sweep above `limits` is
    refused; one that reaches the time cap or is cancelled is shown (partial) but not cached."""
    key = cache_key(engine.model_name, set_name, items, sw)
    if key in state.results:
        state.keep(key, state.results[key])
        yield "done", state.results[key], True
        return
    steps, kinds = steps_of(sw, len(items)), kinds_of(items)
    per_item = steps // max(1, len(items))
    limits.check(len(items), steps, pace.estimate_items(engine.model_name, per_item, kinds) if pace else None,
                 counted=steps_line(sw, len(items)))
    stop = threading.Event()
    with _RUNNING_LOCK:
        if session_id in _RUNNING:
            raise UserError("you have a sweep running or waiting already: each visitor runs one sweep at a time "
                            "(cancel it, or wait for its result)")
        _RUNNING[session_id] = stop
    try:
        if queue is not None:
            queue.join(session_id)
            waits = queue.wait(session_id, gone=stop.is_set)
            while True:
                try:
                    yield "waiting", next(waits)
                except StopIteration as e:
                    if not e.value:
                        raise UserError("the sweep was cancelled while it waited for its turn") from None
                    break
        deadline = Deadline(stop, limits.max_seconds)
        sweep_run = sweeps.SweepRun(engine.adapter, sw, lock=engine.model_lock)
        with opened(items) as got, user_errors("sweeping", "use fewer items, values or methods"):
            t = time.perf_counter()  # a zip is unpacked only now, its turn come
            for done, total in sweep_run.iterate(got, deadline):
                if pace is not None:
                    pace.observe(engine.model_name, time.perf_counter() - t, per_item, kinds[done - 1])
                t = time.perf_counter()
                yield "progress", done, total
        result = sweep_run.result(set_name=set_name, model=engine.model_name)
    finally:
        if queue is not None:
            queue.leave(session_id)
        with _RUNNING_LOCK:
            if _RUNNING.get(session_id) is stop:
                del _RUNNING[session_id]
    if result.n_items == 0:
        raise UserError("the sweep was cancelled before its first item finished" if not deadline.expired else
                        f"the sweep reached this server's limit of {minutes(limits.max_seconds)} per call before "
                        "its first item finished: use a smaller model or fewer methods and values")
    result.time_limited = deadline.expired
    state.keep(f"{key}|cancelled" if result.cancelled else key, result)  # a re-run of a cancelled sweep runs it all
    yield "done", result, False


def estimate_line(pace: Pace | None, model: str, sw, items) -> str:
    """"About N model steps, about T at this model's measured speed." for the status while a sweep starts.
    items: the set (its kinds read for the pace), or a count of images."""
    n_items = items if isinstance(items, int) else len(items)
    steps = steps_of(sw, n_items)
    kinds = ["image"] * n_items if isinstance(items, int) else kinds_of(items)
    est = pace.estimate_items(model, steps // max(1, n_items), kinds) if pace else None
    return f"{steps:,} model steps" + (f", about {minutes(est)} at this model's measured speed" if est else
                                       " (no measured speed for this model yet)")


def cancel(session_id: str) -> bool:
    """Stop this session's running sweep after its current selection; False when none runs."""
    with _RUNNING_LOCK:
        ev = _RUNNING.get(session_id)
    if ev is None:
        return False
    ev.set()
    return True


def status(result, cached: bool = False) -> str:
    sw = result.sweep
    what = "cancelled: partial result" if result.cancelled else ("from this session's cache" if cached else "done")
    if getattr(result, "time_limited", False):
        what = "stopped at this server's time limit per call: partial result"
    ref = result.reference()
    acc = f"; unpruned accuracy {ref['acc']:.3f}" if ref and not math.isnan(ref["acc"]) else ""
    return (f"**Sweep {what}.** {result.n_items} items of {result.set_name}, {len(sw.methods)} methods x "
            f"{len(sw.values)} values of `{sw.param}`: {len(result.records)} answers ({result.n_llm_calls} LLM calls), "
            f"{result.n_encodes} encodings, "
            f"{result.wall_s:.1f} s{acc}.")


def figure(result, x: str = "value", metrics=None):
    if result is None:
        raise UserError("run a sweep first")
    with user_errors("drawing", ""):
        return result.plot(x=x, metrics=list(metrics) if metrics else None)


def downloads(result, out_dir: str) -> list[str]:
    """CSV, JSON and PNG of a sweep under out_dir."""
    base = os.path.join(out_dir, f"sweep-{result.sweep.param}")
    result.plot(base + ".png")
    return [result.to_csv(base + ".csv"), result.to_json(base + ".json"), base + ".png"]


def points_table(result) -> list[list]:
    """The overall points, one row each (for a table on the page)."""
    out = []
    for m in ("none", *result.sweep.methods):
        for r in result.points(m):
            out.append([r["label"], "" if r["value"] is None else str(r["value"]),
                        *[None if math.isnan(r[k]) else round(r[k], 4) for k in sweeps.METRICS], r["n"]])
    return out


def iou(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    union = np.union1d(a, b).size
    return np.intersect1d(a, b).size / union if union else 1.0


def mask_strip(logic, ui: UIState, sw) -> tuple[Image.Image, str]:
    """For the encoding on screen: one row per method (up to MAX_STRIP_METHODS) of kept-patch masks
    across the swept values, and a Markdown table of the IoU between consecutive kept sets."""
    if not isinstance(ui, UIState) or ui.key is None or ui.session is None:
        raise UserError("run the model on an image first (the strip shows the image on screen)")
    engine, enc = logic._current(ui)
    if sw.param == "text_mode" and enc.is_video:
        raise UserError("a text_mode strip re-encodes the image; it is not offered for videos")
    rows, table = [], []
    with user_errors("pruning", "lower the budget"):
        for m in sw.methods[:MAX_STRIP_METHODS]:
            cells, keeps = [], []
            for v in sw.values:
                budget, mode, params = sw.setting(m, v)
                key = ui.key if mode == ui.key.text_mode else engine.encode(
                    ui.session, enc.frames[0], enc.prompt, text_mode=mode, need_attention=True, views=ui.key.views)
                e = engine.encoded(ui.session, key)
                b = budget if isinstance(budget, float) else min(budget, e.n_visual)
                sel = engine.prune(ui.session, key, m, b, **params)
                img = viz.kept_mask(e, sel, frame=0 if e.is_video else None, layout=engine.layout(ui.session, key))
                cells.append((img, f"{v}: {sel.budget} kept"))
                keeps.append(sel.keep.numpy())
            engine.entry(ui.session, ui.key)  # the image on screen stays the most recent encoding
            ious = [iou(a, b) for a, b in zip(keeps, keeps[1:])]
            rows.append((method_spec(m).label, cells, ious))
            table.append(f"| {method_spec(m).label} | " + " | ".join(f"{x:.2f}" for x in ious) + " |")
    head = " | ".join(f"{a} -> {b}" for a, b in zip(sw.values, sw.values[1:]))
    md = (f"IoU of consecutive kept sets (1 = same tokens; a drop shows where the selection flips)"
          f"{' - first frame shown' if enc.is_video else ''}:\n\n| method | {head} |\n|---|"
          + "---|" * (len(sw.values) - 1) + "\n" + "\n".join(table)) if len(sw.values) > 1 else \
        "One value: nothing to compare."
    return _compose(rows), md


def _compose(rows) -> Image.Image:
    """The strip: per row, a label then the masks with their captions and the IoU between them."""
    pad, cap, label_w, gap = 6, 16, 130, 44
    thumbs = [[(im.resize((max(1, round(im.width * THUMB / im.height)), THUMB)), c) for im, c in cells]
              for _, cells, _ in rows]
    width = label_w + max(sum(t.width for t, _ in r) + gap * (len(r) - 1) for r in thumbs) + pad
    height = len(rows) * (THUMB + cap + pad) + pad
    out = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(out)
    for i, ((label, _, ious), row) in enumerate(zip(rows, thumbs)):
        y = pad + i * (THUMB + cap + pad)
        draw.text((pad, y + cap + THUMB // 2 - 6), label[:20], fill="black")
        x = label_w
        for j, (t, caption) in enumerate(row):
            draw.text((x, y), caption, fill="black")
            out.paste(t, (x, y + cap))
            x += t.width
            if j < len(ious):
                draw.text((x + 4, y + cap + THUMB // 2 - 6), f"{ious[j]:.2f}", fill=(180, 60, 0))
                x += gap
    return out


__all__ = ["MAX_ITEMS", "SETS", "SweepState", "ZipSet", "kinds_of", "opened", "cancel", "default_values", "downloads", "figure", "make_sweep",
           "mask_strip", "param_choices", "points_table", "question_set", "run", "status"]
