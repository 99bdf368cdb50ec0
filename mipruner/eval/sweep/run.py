"""Sweeps: one parameter over a question set, for several methods, each item encoded once.

    sw = Sweep(methods=("mi", "random", "similarity"), param="budget", values=(8, 16, 32))
    res = run_sweep(adapter, generated_set("pope", n=60), sw)
    res.to_csv("budget.csv"); res.to_json("budget.json"); res.plot("budget.png")

The parameter is the budget, the prompt tokens scored (`text_mode`) or any registered method
parameter by name (`lam`, `tau`, `aggregation`, `normalization`, `layer`, ...); its values are
validated by its `Param`. Everything else stays fixed: `budget` (when another parameter is swept),
`params` (other method parameters), `text_mode`. Per item, the media and prompt are encoded ONCE
(once per text mode when `text_mode` is swept) and every method x value re-uses that encoding and
one `cache` (`mipruner.select` / `mipruner.answer`), so MI's PMI and the in-LLM prefix are computed
once per item. A method that does not take the swept parameter is run once per item and drawn
flat (`varies` False). Random runs `seeds` (0, 1, 2 as the eval table) and averages them. When two
selections of one encoding keep exactly the same tokens, the LLM's (greedy) answer is reused: it is
a function of the kept tokens (in-LLM and merging methods are always answered).

Each (method, value) point holds accuracy, F1 and yes-rate (yes/no questions), query recall (the
share of the asked object's tokens kept, where masks exist), mean tokens kept, mean select time and
mean LLM prefill time, and `flops`: the mean share of the unpruned prefill FLOPs the selections imply
(`mipruner.measure.compute`; `SweepResult.at_compute(share)` picks, per method, the budget closest to a share). `prune_ms` is the select time with the item's cache filled (each method's
first select on an item runs once untimed: MI's PMI, the in-LLM prefix), so the values compare
what changing the swept parameter costs, as a slider move does in the app. Sweeping
`lam` sets `lam_rule` to "fixed" unless given (else the paper's rule would override the values).
"""
from __future__ import annotations

import contextlib
import time

import mipruner
from mipruner.serve.failures import guarded
from mipruner.pruners import get_pruner
from mipruner.pruners.signals import encode_kwargs

from ..runner import flops_share
from ..metrics import answer_matches, parse_yes_no, query_recall, token_object_cover
from .result import COLUMNS, METRICS, SweepResult, summarise
from .spec import SPECIAL, Sweep, parse_value, parse_values, sweepable
from .sets import GENERATED, describe, generated_set, media_bytes, unpacked_set, user_set

class SweepRun:
    """A sweep in progress: `iterate(items)` (or `add(item)`) evaluates items; `result()` at any time.

    lock: a context manager held around each call into the model (the app's model lock, shared with other
    users), so they wait for one encoding or answer at most, not for a whole item.
    """

    def __init__(self, adapter, sweep: Sweep, *, lock=None):
        self.adapter, self.sweep, self.lock = adapter, sweep, lock
        self.records: list[dict] = []
        self.n_items = self.n_encodes = self.n_answers = self.total = 0
        self.cancelled = False
        self.set_info: dict = {}
        self.signals = mipruner.signals_for(sweep.methods)  # what the methods read of the encoder, one pass
        self.need_attention = self.signals.attention
        self.modes = sweep.values if sweep.param == "text_mode" else (sweep.text_mode,)
        self.t0 = time.perf_counter()

    def iterate(self, items, should_stop=None):
        """Evaluate `items` one by one, yielding (done, total) after each. should_stop() -> True stops
        between selections (the unfinished item is dropped) and sets `cancelled`."""
        items = list(items)
        self.total, self.set_info = len(items), describe(items)
        for i, item in enumerate(items):
            if should_stop is not None and should_stop():
                self.cancelled = True
                return
            if not self.add(item, should_stop):
                self.cancelled = True
                return
            yield i + 1, len(items)

    def add(self, item, should_stop=None) -> bool:
        """Evaluate `item`; False (and nothing kept of it) when `should_stop()` turned true meanwhile."""
        sw, ad = self.sweep, self.adapter
        encs = {}
        for mode in self.modes:
            with self._locked():
                encs[mode] = ad.encode(item.media, item.question, text_mode=mode, **encode_kwargs(self.signals))
            self.n_encodes += 1
        first = encs[self.modes[0]]
        cover = token_object_cover(first.geometry, item.masks) if item.masks is not None else None
        caches = {mode: {} for mode in self.modes}
        answers = {mode: {} for mode in self.modes}  # kept token indices -> Answer, per encoding
        warm: set = set()
        gold = {"item": item.id, "split": item.split, "kind": item.kind, "answer": item.answer}
        with self._locked():
            ref = mipruner.answer(ad, first, None, max_new_tokens=sw.max_new_tokens)
        self.n_answers += 1
        recs = [self._record(gold, "none", None, None, ref.text, None if cover is None else 1.0, first.n_visual, 0.0,
                             ref.prefill_s, flops=1.0)]
        for m in sw.methods:
            for v in (sw.values if sw.varies(m) else sw.values[:1]):
                budget, mode, params = sw.setting(m, v)
                for seed in sw.seeds_of(m):
                    if should_stop is not None and should_stop():
                        return False
                    kw = params if seed is None else {**params, "seed": seed}
                    got, why = guarded(m, lambda: self._run(encs[mode], m, budget, kw, caches[mode],
                                                            answers[mode], warm, mode))
                    if why is not None:  # this method failed on this item: its record says why, the rest go on
                        recs.append({**gold, "method": m, "value": v, "seed": seed, "prediction": None,
                                     "correct": False, "query_recall": None, "kept": None, "prune_ms": None,
                                     "prefill_ms": None, "lam": None, "flops": None, "error": why})
                        continue
                    sel, ans, prune_s = got
                    rec = query_recall(sel.keep, cover) if cover is not None else None
                    recs.append(self._record(gold, m, v, seed, ans.text, rec, sel.budget, prune_s, ans.prefill_s,
                                             sel.extras.get("lam"), flops_share(sel)))
        self.records += recs
        self.n_items += 1
        return True

    def _run(self, enc, m: str, budget, kw: dict, cache: dict, answers: dict, warm: set, mode):
        """(selection, answer, select seconds) of one method at one setting on one encoding."""
        ad, sw = self.adapter, self.sweep
        if (m, mode) not in warm:  # fills the method's cache (MI's PMI, the in-LLM prefix) untimed
            with self._locked():
                mipruner.select(ad, enc, m, budget, cache=cache, strict=False, **kw)
            warm.add((m, mode))
        with self._locked():
            t = time.perf_counter()
            sel = mipruner.select(ad, enc, m, budget, cache=cache, strict=False, **kw)
            prune_s = time.perf_counter() - t
        key = tuple(sel.keep.tolist()) if reusable(m, sel) else None
        ans = answers.get(key) if key is not None else None
        if ans is None:
            with self._locked():
                ans = mipruner.answer(ad, enc, sel, max_new_tokens=sw.max_new_tokens, cache=cache)
            self.n_answers += 1
            if key is not None:
                answers[key] = ans
        return sel, ans, prune_s

    def _locked(self):
        """The shared model's lock for one call into the model (an encoding, a selection, an answer): other
        users' requests wait for one call, never for a whole item."""
        return self.lock if self.lock is not None else contextlib.nullcontext()

    @staticmethod
    def _record(gold, method, value, seed, text, recall, kept, prune_s, prefill_s, lam=None, flops=None) -> dict:
        if gold["kind"] == "yesno":
            correct = parse_yes_no(text) == parse_yes_no(gold["answer"])
        else:
            correct = answer_matches(text, gold["answer"])
        r = {**gold, "method": method, "value": value, "seed": seed, "prediction": text, "correct": bool(correct),
             "query_recall": recall, "kept": kept, "prune_ms": prune_s * 1e3, "prefill_ms": prefill_s * 1e3,
             "lam": lam, "flops": flops}  # lam: the lambda applied (the MI methods; "auto" picks it per prompt);
        # flops: the share of the unpruned prefill FLOPs the selection implies (`mipruner.measure.compute`)
        return r

    def result(self, *, set_name: str = "", set_info: dict | None = None, model: str = "") -> "SweepResult":
        return SweepResult(self.sweep, summarise(self.sweep, self.records), self.records, self.n_items, self.n_encodes,
                           time.perf_counter() - self.t0, self.cancelled, set_name, set_info or self.set_info, model,
                           self.n_answers)


def reusable(method: str, sel) -> bool:
    """Whether `sel`'s answer is a function of its kept indices alone (pre-LLM, nothing merged)."""
    return get_pruner(method).stage != "llm" and sel.tokens is None


def run_sweep(adapter, items, sweep: Sweep, *, progress=None, should_stop=None, lock=None, set_name: str = "",
              model: str = "") -> SweepResult:
    """Run `sweep` over `items` (see the module docstring and `SweepRun.iterate`).

    progress(done, total) after every item; should_stop() -> True cancels; Ctrl-C does the same.
    The result says `cancelled` and how many items it holds.
    """
    run = SweepRun(adapter, sweep, lock=lock)
    try:
        for done, total in run.iterate(items, should_stop):
            if progress is not None:
                progress(done, total)
    except KeyboardInterrupt:
        run.cancelled = True
    return run.result(set_name=set_name, model=model)


__all__ = ["COLUMNS", "GENERATED", "METRICS", "SPECIAL", "Sweep", "SweepResult", "SweepRun", "describe", "generated_set",
           "media_bytes", "parse_value", "parse_values", "run_sweep", "summarise", "sweepable", "unpacked_set", "user_set"]
