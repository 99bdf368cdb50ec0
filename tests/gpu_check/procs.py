"""gpu-check with each family in its own process: a CUDA fault or an abort costs only that family's rows.

A device-side assert or an illegal address ends a CUDA process (or leaves its CUDA context unusable,
so every later kernel fails), and a `try` around a row cannot catch an abort. So the parent runs
`python -X faulthandler -m tests.gpu_check run --child --families F ...` (from the repository root) per family, streams
its output, and reads its report (saved before every row, with the row in flight). When the child
dies (a signal, or exit code 3 after a CUDA fault it caught), the parent keeps the rows it finished
and runs the family's unfinished media once more with CUDA_LAUNCH_BLOCKING=1 (each kernel
synchronous: the error names the kernel that failed). If that dies too, the row in flight is marked
`the process died in this row (<cause>)` and the rows after it `not run: ...`; the cause is the
signal or exit code and the fault's line (Python's fatal-error line with its innermost frame, or the
last error line printed). Each (family, media) entry of `families` lists the family's `attempts`
(exit code, cause, environment, seconds). The protocol runs afterwards in a process of its own.
Plug-ins loaded by the parent reach the children through MIPRUNER_PLUGINS.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from mipruner.bench.zoo import get_family

from .rows import planned_rows

RETRY_ENV = {"CUDA_LAUNCH_BLOCKING": "1"}


def child_args(a, **over) -> list[str]:
    """The options of `a` (with `over` replacing some) as gpu-check arguments; defaults left out."""
    v = dict(vars(a), **over)
    out: list[str] = []
    for flag in ("tiny", "static_cache", "protocol_only", "child"):
        if v.get(flag):
            out.append("--" + flag.replace("_", "-"))
    for key in ("device", "llm_layers", "dtype", "families", "media", "methods", "shares", "new_tokens", "seed",
                "budget_s", "repeats", "warmup", "cells", "isolate", "threads", "json"):
        val = v.get(key)
        if val is not None and val != DEFAULTS.get(key):
            out += ["--" + key.replace("_", "-"), str(val)]
    if v.get("protocol") is not None and not v.get("protocol_only"):
        out.append("--protocol" if v["protocol"] else "--no-protocol")
    return out


DEFAULTS = {"families": "all", "media": "all", "methods": "all", "shares": "0.25,0.1", "new_tokens": 4, "seed": 0,
            "budget_s": 200.0, "repeats": 5, "warmup": 2, "cells": "all", "isolate": "auto"}


def _plugins_env() -> dict:
    from mipruner import plugins

    loaded = [k for k, label in plugins._LOADED.items() if "entry point" not in label]  # entry points load anyway
    return {plugins.ENV: ",".join(loaded)} if loaded else {}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def spawn(args: list[str], env_extra: dict, log) -> tuple[int, list[str], float]:
    """Run one child gpu-check; its output streamed to `log`. (exit code, last lines, seconds). The checkout
    goes first on the child's PYTHONPATH, so `-m tests.gpu_check` resolves from any working folder."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, **_plugins_env(), **env_extra)
    cmd = [sys.executable, "-X", "faulthandler", "-m", "tests.gpu_check", "run", *args]
    t0 = time.monotonic()
    tail: collections.deque = collections.deque(maxlen=60)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          errors="replace") as p:
        for line in p.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            log(line)
        rc = p.wait()
    return rc, list(tail), time.monotonic() - t0


def cause(rc: int, tail: list[str]) -> str:
    """Why a child ended: the signal or exit code, and the fault's line from its output, e.g.
    `killed by SIGABRT: Fatal Python error: Aborted at File "x.py", line 9 in f`."""
    if rc < 0:
        try:
            what = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            what = f"killed by signal {-rc}"
    elif rc == 3:
        what = "exit code 3 after a CUDA fault"
    else:
        what = f"exit code {rc}"
    line = ""
    for i, t in enumerate(tail):
        if t.startswith("Fatal Python error"):
            frame = next((x.strip() for x in tail[i + 1:] if x.strip().startswith("File ")), "")
            line = t + (f" at {frame}" if frame else "")
            break
    if not line:
        line = next((t.strip() for t in reversed(tail) if "Error" in t or "error:" in t or "CUDA fault" in t), "")
    return what + (f": {line}" if line else "")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def run_family(a, s, name: str, tmp: str, log) -> tuple[list[dict], list[dict]]:
    """(rows, families entries) of one family, from one process and, if it dies, one retry."""
    kinds = [k for k in get_family(name).media if k in s.media]
    rows: list[dict] = []
    infos: list[dict] = []
    attempts: list[dict] = []
    todo = list(kinds)
    for attempt, extra in enumerate(({}, RETRY_ENV)):
        part = os.path.join(tmp, f"{name}-{attempt}.json")
        args = child_args(a, families=name, media=",".join(todo), json=part, child=True, protocol=False,
                          protocol_only=False, isolate="none")
        if extra:
            log(f"{name}: again with {' '.join(f'{k}={v}' for k, v in extra.items())} (media {', '.join(todo)})")
        rc, tail, secs = spawn(args, extra, log)
        child = _read(part)
        done = {f["media"] for f in child.get("families", [])}
        rows += child.get("rows", [])
        infos += child.get("families", [])
        todo = [k for k in todo if k not in done]
        died = rc not in (0, 1) or bool(todo)
        attempts.append({"env": extra, "rc": rc, "seconds": round(secs, 1),
                         "cause": cause(rc, tail) if died else None})
        if not died:
            break
        why = attempts[-1]["cause"]
        log(f"{name}: the process died ({why})")
        if attempt == 0:
            continue
        flight = child.get("in_flight") or {}
        where = ""
        if flight.get("rows"):
            last = flight["rows"][-1]
            where = f" in {flight['media']} {last['method']} {last['budget']}"
        for k in todo:
            done_rows = list(flight.get("rows", [])) if flight.get("media") == k else []
            if done_rows:
                done_rows[-1].update(ok=False, error=f"the process died in this row ({why})")
            rest = planned_rows(name, k, s.methods, s.shares)[len(done_rows):]
            for r in rest:
                r["error"] = f"not run: the family's process died{where} ({why})"
            rows += done_rows + rest
            infos.append({"family": name, "media": k, "error": f"the process died ({why})"})
    for info in infos:
        if info["family"] == name:
            info["attempts"] = attempts
    return rows, infos


def run_isolated(a, s, report: dict, save, log) -> None:
    """Every family in its own process, then the protocol in one more; `report` filled and saved as it goes."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if not a.protocol_only:
            for name in s.families:
                rows, infos = run_family(a, s, name, tmp, log)
                report["rows"] += rows
                report["families"] += infos
                save()
        if s.protocol:
            part = os.path.join(tmp, "protocol.json")
            args = child_args(a, families="llava", json=part, child=True, protocol_only=True, isolate="none")
            rc, tail, _ = spawn(args, {}, log)
            got = _read(part).get("protocol")
            report["protocol"] = got if got and rc in (0, 1) else dict(got or {}, error=f"the protocol's process "
                                                                                     f"died ({cause(rc, tail)})")
            save()
