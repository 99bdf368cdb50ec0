"""The rows of `python -m tests.gpu_check run`: one (family, media) encoding, every method x budget.

Per (family, media): ONE encoding (with the vision encoder's attention, which some methods read),
the unpruned answer, then
  keep-all   every visual token kept (kept indices 0..N_V-1 through `adapter.generate`): ok only when
             its greedy tokens equal the unpruned answer's (the anchor: pruning code that keeps all
             is the unpruned model);
  <method>   for each budget share f: K = max(1, floor(f * N_V + 0.5)) tokens; `mipruner.select` with a
             fresh per-encoding cache (select_ms: the cold selection, what one slider move of a new
             method costs), then `mipruner.answer` one by one (answer_ms), then the app's batched
             path: `mipruner.serve.batch.answer_items` of [(encoding, unpruned), (encoding, selection)]
             as one batch (batch_ms; in-LLM selections answer one by one inside it).
A row is ok when nothing raised, the selection keeps 1..K tokens (prefix rows counted), the one-by-one
answer has 1..new_tokens tokens, the batched call returns both rows, and every logit the output head
produced for the row (both answers) was finite (`finite_logits.LogitWatch`: a greedy answer over NaN
logits still has tokens). `batch_equal` says whether the
batched tokens equal the one-by-one ones; it does not decide `ok`: a left-padded batch is not
bit-identical to one prompt alone, so greedy tokens may differ where two logits nearly tie (random
weights in bf16 tie often). On CUDA every timing is bracketed by `torch.cuda.synchronize`; peak_mb is
`torch.cuda.max_memory_allocated` above the allocation before the row (select + both answers);
None on other devices. A row that raises keeps the last line of its traceback in `error`.
"""
from __future__ import annotations

import json
import time
import traceback

import torch

import mipruner
from mipruner.serve.batch import answer_items
from mipruner.pruners import get_pruner, resolve_budget

from mipruner.bench.finite_logits import LogitWatch

KEEP_ALL = "keep-all"
REDRAWS = 3  # unpruned answers drawn again when keep-all differs from the first (see keep_all_row)
FIELDS = ("family", "media", "method", "budget", "kept", "n_visual", "ok", "error", "select_ms", "answer_ms",
          "batch_ms", "batch_equal", "peak_mb")


def last_line(e: BaseException) -> str:
    """The last line of the exception's traceback: `Type: message`."""
    return traceback.format_exception_only(type(e), e)[-1].strip()


def empty_row(family: str, media: str, method: str, budget, error: str | None = None) -> dict:
    return dict(family=family, media=media, method=method, budget=budget, kept=None, n_visual=None, ok=False,
                error=error, select_ms=None, answer_ms=None, batch_ms=None, batch_equal=None, peak_mb=None)


def planned_rows(family: str, media: str, methods: list[str], shares: list[float], error: str | None = None):
    """The rows of one (family, media), not yet run: the keep-all anchor, then each method x share (a video
    method, `MethodSpec.video`, on video media only: on an image it does not apply)."""
    methods = [m for m in methods if media == "video" or not get_pruner(m).video]
    return [empty_row(family, media, m, s, error) for m, s in [(KEEP_ALL, 1.0)] + [(m, s) for m in methods
                                                                                     for s in shares]]


class Clock:
    """Wall-clock milliseconds with the device synchronised at both ends, and CUDA peak memory."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.device = torch.device(device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def start_peak(self) -> int:
        if not self.cuda:
            return 0
        self.sync()
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def peak_mb(self, base: int) -> float | None:
        if not self.cuda:
            return None
        self.sync()
        return round((torch.cuda.max_memory_allocated(self.device) - base) / 2 ** 20, 1)


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1e3, 3)


def _check_answer(ans, new_tokens: int, what: str) -> None:
    n = len(ans.token_ids)
    if not 1 <= n <= new_tokens:
        raise RuntimeError(f"{what} has {n} tokens, not 1..{new_tokens}")


def keep_all_row(adapter, enc, ref, row: dict, clock: Clock, new_tokens: int) -> dict:
    """The anchor: every visual token kept gives the unpruned answer's tokens."""
    keep = torch.arange(enc.n_visual)
    base = clock.start_peak()
    t0 = clock.now()
    one = adapter.generate(enc, keep=keep, max_new_tokens=new_tokens)
    t1 = clock.now()
    both = answer_items(adapter, [(enc, None), (enc, keep)], max_new_tokens=new_tokens)
    t2 = clock.now()
    row.update(kept=enc.n_visual, select_ms=0.0, answer_ms=_ms(t0, t1), batch_ms=_ms(t1, t2),
               peak_mb=clock.peak_mb(base),
               batch_equal=[a.token_ids for a in both] == [ref.token_ids, ref.token_ids])
    if one.token_ids != ref.token_ids:
        # The anchor is the computation, not one draw of a greedy near-tie: on an H100 in bf16, HF's
        # `generate` gave the unpruned answers A, B, B, A, B on five calls with the same inputs (prefill
        # logits bit-equal). So the unpruned answer is drawn again (up to REDRAWS times): keep-all must
        # equal one of the draws, with bit-equal prefill logits; a keep-all answer that no draw gives fails.
        draws = [ref.token_ids]
        for _ in range(REDRAWS):
            draws.append(adapter.generate(enc, None, max_new_tokens=new_tokens).token_ids)
            if draws[-1] == one.token_ids:
                break
        if one.token_ids not in draws:
            raise RuntimeError(f"keep-all answer {one.token_ids} != unpruned answer {ref.token_ids}")
        if not torch.equal(adapter.prefill_logits(enc, keep), adapter.prefill_logits(enc, None)):
            raise RuntimeError("keep-all prefill logits differ from the unpruned ones")
        row["note"] = (f"the unpruned answer is not reproducible in this dtype (draws {draws}); keep-all gave "
                       "one of them and its prefill logits equal the unpruned ones bit for bit")
    _check_answer(one, new_tokens, "the keep-all answer")
    return row


def method_row(adapter, enc, ref, method: str, share: float, row: dict, clock: Clock, new_tokens: int) -> dict:
    """One method at one budget share: select (cold cache), answer one by one, answer batched."""
    k = resolve_budget(share, enc.n_visual)  # floor(share * N_V + 0.5), at least 1
    cache: dict = {}
    base = clock.start_peak()
    t0 = clock.now()
    sel = mipruner.select(adapter, enc, method, k, cache=cache, strict=False)
    t1 = clock.now()
    one = mipruner.answer(adapter, enc, sel, max_new_tokens=new_tokens, cache=cache)
    t2 = clock.now()
    both = answer_items(adapter, [(enc, None), (enc, sel)], max_new_tokens=new_tokens)
    t3 = clock.now()
    row.update(kept=sel.budget, select_ms=_ms(t0, t1), answer_ms=_ms(t1, t2), batch_ms=_ms(t2, t3),
               peak_mb=clock.peak_mb(base), batch_equal=[a.token_ids for a in both] == [ref.token_ids, one.token_ids])
    if not 1 <= sel.budget <= k:
        raise RuntimeError(f"the selection keeps {sel.budget} tokens, not 1..{k}")
    _check_answer(one, new_tokens, "the answer")
    if len(both) != 2:
        raise RuntimeError(f"the batched call returned {len(both)} answers for 2 rows")
    _check_answer(both[1], new_tokens, "the batched answer")
    return row


def device_fault(error: str) -> bool:
    """Whether a row's error is a CUDA fault that leaves the process's CUDA context unusable (every
    later kernel fails with it): a device-side assert, an illegal address, a launch failure."""
    return any(s in error for s in ("CUDA error", "device-side assert", "illegal memory access",
                                    "CUBLAS_STATUS_EXECUTION_FAILED", "cudaErrorLaunchFailure"))


class DeviceFault(RuntimeError):
    """A row hit a CUDA fault: the rest of this process's rows cannot run (gpu-check's per-family
    process ends here, and the parent retries the family's unfinished media)."""


def check_media(adapter, family: str, kind: str, media, prompt: str, methods: list[str], shares: list[float],
                new_tokens: int, clock: Clock, log=print, on_row=None) -> tuple[list[dict], dict]:
    """Every row of one (family, media): (rows, info with n_visual and the encode time).
    on_row(row): called before each row runs (the per-family process records the row in flight).
    A CUDA fault (`device_fault`) ends the media with `DeviceFault` after recording its row."""
    rows = planned_rows(family, kind, methods, shares)
    info: dict = {"family": family, "media": kind}
    try:
        with torch.inference_mode(), LogitWatch(adapter) as watch:
            t0 = clock.now()
            enc = mipruner.encode_for(adapter, media, prompt, methods)  # with every signal the methods read
            t1 = clock.now()
            ref = adapter.generate(enc, None, max_new_tokens=new_tokens)
            t2 = clock.now()
        _check_answer(ref, new_tokens, "the unpruned answer")
        watch.check("the unpruned answer")
    except Exception as e:  # noqa: BLE001  (every row of this media fails with the reason)
        err = f"encode / unpruned answer failed: {last_line(e)}"
        log(f"  {family} {kind}: {err}")
        for r in rows:
            r["error"] = err
        return rows, dict(info, error=err)
    info.update(n_visual=enc.n_visual, encode_ms=_ms(t0, t1), unpruned_answer_ms=_ms(t1, t2),
                unpruned_tokens=list(ref.token_ids))
    for r in rows:
        r["n_visual"] = enc.n_visual
        if on_row is not None:
            on_row(r)
        try:
            with torch.inference_mode(), LogitWatch(adapter) as watch:
                if r["method"] == KEEP_ALL:
                    keep_all_row(adapter, enc, ref, r, clock, new_tokens)
                else:
                    method_row(adapter, enc, ref, r["method"], r["budget"], r, clock, new_tokens)
            watch.check("the row's answers")
            r["ok"] = True
        except Exception as e:  # noqa: BLE001  (recorded; the run goes on)
            r["ok"], r["error"] = False, last_line(e)
            if device_fault(r["error"]):
                raise DeviceFault(r["error"]) from e
            if clock.cuda:  # e.g. out of memory: give the cached blocks back before the next row
                torch.cuda.empty_cache()
    bad = [r for r in rows if not r["ok"]]
    log(f"  {family} {kind}: N_V {enc.n_visual}, encode {info['encode_ms']:.0f} ms, {len(rows) - len(bad)}/{len(rows)} "
        f"rows ok" + "".join(f"\n    FAIL {r['method']} {r['budget']}: {r['error']}" for r in bad))
    del enc
    return rows, info


def format_rows(rows: list[dict]) -> str:
    from mipruner.bench.timing import table

    def f(x, d=1):
        return "-" if x is None else f"{x:.{d}f}"

    body = [[r["family"], r["media"], r["method"], str(r["budget"]), str(r["kept"]), "ok" if r["ok"] else "FAIL",
             f(r["select_ms"], 2), f(r["answer_ms"]), f(r["batch_ms"]), "-" if r["batch_equal"] is None
             else "=" if r["batch_equal"] else "differs", f(r["peak_mb"])] for r in rows]
    return table(body, ["family", "media", "method", "budget", "kept", "ok", "select ms", "answer ms", "batch ms",
                        "batch vs one", "peak MB"])


def summary(report: dict, path: str | None) -> int:
    """Print the rows, the protocol's goals and the failing rows; the exit code (0: every row ok)."""
    rows = report["rows"]
    if rows:
        print("\n" + format_rows(rows))
    goals = (report["protocol"] or {}).get("goals")
    if goals:
        print("\nprotocol goals: " + json.dumps({k: v for k, v in goals.items() if k != "select_median_ms"}))
    bad = [r for r in rows if not r["ok"]]
    what = f"{len(rows) - len(bad)}/{len(rows)} rows ok" if rows else "the protocol alone (no rows)"
    print(f"\n{what} on {report['device']} ({report['dtype']}), {report['wall_s']:.0f} s"
          + (f"; report in {path}" if path else ""))
    if bad:
        print("failing rows:\n" + format_rows(bad))
    protocol = report.get("protocol")
    return 1 if bad or (not rows and (not protocol or "error" in protocol)) else 0
