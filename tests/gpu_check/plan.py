"""gpu-check in pieces: `plan` prints commands that each fit a time limit; `merge` joins their reports.

A lent GPU runs one command for at most 10 minutes. `plan(a, s)` packs the families of the run
into commands, in zoo order, so that each command's estimate, with room for one retry of its
longest family, fits `--limit-s` minus `START_S` (installing the pinned wheels, imports). The
protocol gets a command of its own (`--protocol-only`, its `--budget-s` what the limit leaves).
A family longer than the limit alone is split by medium. Estimates per (family, media): the seconds
of the first H100 run (docs/gpu/2026-11-25-h100-gpu-check.json: select + answer + batch ms of its
rows, plus the encode and the unpruned answer; bf16, 13 methods x 2 shares), scaled by this run's
rows per medium, plus `PROCESS_S` per process. `--plan-from REPORT` reads the seconds from another
report instead (e.g. a CPU run's, for CPU commands).

`python -m tests.gpu_check merge A.json B.json ... --json ALL.json` joins reports of one
device, dtype and shape (their header keys must agree): rows and families concatenated (a later
report's row of the same family, media, method and budget replaces an earlier one), the protocols'
cells joined (a later cell replaces the same cell of an earlier part) and their goals computed
again from the joined cells. `parts` lists each input's file, command and seconds. Exit code as
gpu-check's: 0 when every row is ok.
"""
from __future__ import annotations

import argparse
import json
import shlex

from mipruner.bench.zoo import get_family

from .procs import child_args
from .rows import summary

# seconds per (family, media) of the first H100 run (bf16, 13 methods x 2 shares + the anchor, 4 new tokens)
H100_S = {("llava", "image"): 22.1, ("llava", "images"): 12.6, ("llava", "video"): 17.7,
          ("llava_next", "image"): 16.2, ("video_llava", "image"): 14.7, ("video_llava", "video"): 15.2,
          ("qwen2_vl", "image"): 15.7, ("qwen2_vl", "video"): 11.6, ("qwen2_5_vl", "image"): 18.4,
          ("qwen2_5_vl", "video"): 16.5, ("qwen3_vl", "image"): 13.3, ("qwen3_vl", "video"): 14.9,
          ("llava_onevision", "image"): 13.2, ("llava_onevision", "images"): 13.7,
          ("llava_onevision", "video"): 13.1, ("internvl", "image"): 16.6, ("internvl", "images"): 25.8,
          ("internvl", "video"): 15.8}
H100_ROWS = 1 + 13 * 2
PROCESS_S = 30.0  # one family's process: imports, CUDA context, building a 7B model on the GPU (the H100 run: 22 s for all 8)
START_S = 60.0  # one command: installing the wheels, nvidia-smi, the parent's imports
HEADER = ("device", "torch", "transformers", "dtype", "tiny", "llm_layers", "new_tokens", "static_cache")


def seconds_per_media(report: dict) -> dict:
    """{(family, media): seconds} of a report's rows (select + answer + batch) and encodings."""
    out: dict = {}
    for r in report["rows"]:
        key = (r["family"], r["media"])
        out[key] = out.get(key, 0.0) + sum((r.get(k) or 0.0) for k in ("select_ms", "answer_ms", "batch_ms")) / 1e3
    for f in report["families"]:
        key = (f["family"], f["media"])
        out[key] = out.get(key, 0.0) + ((f.get("encode_ms") or 0.0) + (f.get("unpruned_answer_ms") or 0.0)) / 1e3
    return {k: round(v, 1) for k, v in out.items()}


def plan(a, s) -> str:
    """The commands (one a line, each with its estimate) and the merge step, as text."""
    table, rows_then = H100_S, H100_ROWS
    if a.plan_from:
        with open(a.plan_from) as f:
            ref = json.load(f)
        table, rows_then = seconds_per_media(ref), 1 + len(ref["methods"]) * len(ref["shares"])
    scale = (1 + len(s.methods) * len(s.shares)) / rows_then
    fallback = max(table.values())  # a (family, media) the reference lacks: its slowest
    usable = a.limit_s - START_S
    groups: list[tuple[list[str], str, list[float]]] = []  # (families, --media, seconds per process)
    cur: list[tuple[str, float]] = []

    def flush():
        if cur:
            groups.append(([n for n, _ in cur], a.media, [t for _, t in cur]))
            cur.clear()

    for name in [] if a.protocol_only else s.families:
        kinds = [k for k in get_family(name).media if k in s.media]
        est = {k: table.get((name, k), fallback) * scale for k in kinds}
        total = PROCESS_S + sum(est.values())
        if 2 * total > usable and len(kinds) > 1:  # too long for one command with its retry: one medium each
            flush()
            groups += [([name], k, [PROCESS_S + est[k]]) for k in kinds]
            continue
        secs = [t for _, t in cur] + [total]
        if cur and sum(secs) + max(secs) > usable:
            flush()
        cur.append((name, total))
    flush()
    lines = [f"# gpu-check as {len(groups) + bool(s.protocol)} commands of at most {a.limit_s:.0f} s each "
             f"(estimates from {a.plan_from or 'the first H100 run'}, {PROCESS_S:.0f} s per process, "
             f"{START_S:.0f} s per command, room for one retry of its longest family). Run each as its own "
             "command, then merge the reports where they came back:"]
    parts = []
    for i, (fams, media, secs) in enumerate(groups, 1):
        parts.append(f"gpu-check-{i}.json")
        args = child_args(a, families=",".join(fams), media=media, protocol=False, protocol_only=False,
                          cells="all", budget_s=200.0, json=parts[-1])
        lines.append(f"python -m tests.gpu_check run {shlex.join(args)}   # about {sum(secs):.0f} s, "
                     f"{sum(secs) + max(secs):.0f} s with a retry")
    if s.protocol:
        parts.append(f"gpu-check-{len(groups) + 1}.json")
        budget = max(30.0, min(a.budget_s, usable - 2 * PROCESS_S) if a.budget_s != 200.0 else usable - 2 * PROCESS_S)
        args = child_args(a, families="all", media="all", methods="all", shares="0.25,0.1", protocol_only=True,
                          budget_s=budget, json=parts[-1])
        lines.append(f"python -m tests.gpu_check run {shlex.join(args)}   # about {budget + PROCESS_S:.0f} s")
    lines.append(f"python -m tests.gpu_check merge {' '.join(parts)} --json gpu-check.json")
    return "\n".join(lines)


def merge(reports: list[dict], files: list[str]) -> dict:
    """One report of several parts (see the module docstring)."""
    from .protocol import goals

    if not reports:
        raise SystemExit("merge needs at least one report")
    first = reports[0]
    for f, r in zip(files[1:], reports[1:]):
        diff = [k for k in HEADER if r.get(k) != first.get(k)]
        if diff:
            raise SystemExit(f"{f} differs from {files[0]} in {', '.join(f'{k} ({r.get(k)!r} vs {first.get(k)!r})' for k in diff)}")
    out = {k: first.get(k) for k in HEADER}
    rows: dict = {}
    fams: dict = {}
    methods: list = []
    shares: list = []
    cells: dict = {}
    skipped: list = []
    protocol: dict | None = None
    for r in reports:
        for row in r["rows"]:
            rows[(row["family"], row["media"], row["method"], row["budget"])] = row
        for f in r["families"]:
            fams[(f["family"], f["media"])] = f
        methods += [m for m in r.get("methods", []) if m not in methods]
        shares += [x for x in r.get("shares", []) if x not in shares]
        p = r.get("protocol")
        if p:
            protocol = dict(p) if protocol is None else dict(protocol, **{k: v for k, v in p.items() if k != "cells"})
            for c in p.get("cells", []):
                key = ("select", c["method"]) if c.get("cell") == "select" else (c.get("phase"), c.get("kind"),
                                                                                   c.get("method"), c.get("batch"))
                cells[key] = c
            skipped += p.get("skipped", [])
    if protocol is not None:
        done = {(c.get("phase"), c.get("kind"), c.get("method"), c.get("batch")) for c in cells.values()}
        protocol["cells"] = list(cells.values())
        protocol["skipped"] = [x for x in skipped if (x.get("phase"), x.get("kind"), x.get("method"),
                                                      x.get("batch")) not in done]
        protocol["spent_s"] = round(sum((r.get("protocol") or {}).get("spent_s", 0.0) for r in reports), 1)
        protocol["goals"] = goals(protocol["cells"], "mi:lam=1")
    out.update(command="python -m tests.gpu_check merge " + " ".join(files), shares=shares,
               methods=methods, families=list(fams.values()), rows=list(rows.values()), protocol=protocol,
               wall_s=round(sum(r.get("wall_s", 0.0) for r in reports), 1),
               parts=[{"file": f, "command": r.get("command"), "wall_s": r.get("wall_s")} for f, r in zip(files, reports)])
    return out


def merge_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.gpu_check merge",
                                description="join gpu-check reports (of one device, dtype and shape) into one")
    p.add_argument("reports", nargs="+", help="the parts' JSON reports, in order (a later row replaces an earlier one)")
    p.add_argument("--json", help="write the joined report here")
    a = p.parse_args(argv)
    parts = []
    for f in a.reports:
        with open(f) as fh:
            parts.append(json.load(fh))
    report = merge(parts, a.reports)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return summary(report, a.json)
