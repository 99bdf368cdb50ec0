"""tests/gpu_check (outside the package): `plan` covers every family in commands that fit a lent machine's
per-call limit, with the first H100 run's seconds; `merge` joins the commands' reports and recomputes the
protocol's goals."""
from __future__ import annotations

import json
import os
import shlex

import pytest

from mipruner.bench import zoo

from tests.gpu_check import check as gpu_check
from tests.gpu_check.__main__ import main as tools_main
from tests.gpu_check.plan import H100_S, PROCESS_S, START_S, merge, merge_main, seconds_per_media
from tests.gpu_check.rows import planned_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100_REPORT = os.path.join(ROOT, "docs", "gpu", "2026-11-25-h100-gpu-check.json")


def _plan(capsys, *args):
    assert tools_main(["plan", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    runs = [x for x in out if x.startswith("python -m tests.gpu_check run")]
    merge_line, = [x for x in out if x.startswith("python -m tests.gpu_check merge")]
    parsed = []
    for line in runs:
        command, _, note = line.partition("#")
        a = gpu_check.parse_args(shlex.split(command)[4:])
        parsed.append((a, gpu_check.settings(a), note))
    return parsed, merge_line


@pytest.mark.parametrize("limit", [600, 240])  # 240: one family x medium, 22 methods, fits with a retry (146 s)
def test_plan_covers_every_family_within_the_limit(capsys, limit):
    parsed, merge_line = _plan(capsys, "--device", "cuda", "--limit-s", str(limit))
    rows = [(a, s) for a, s, _ in parsed if not a.protocol_only]
    covered = sorted((f, k) for a, s in rows for f in s.families for k in zoo.get_family(f).media if k in s.media)
    assert covered == sorted((f.name, k) for f in zoo.FAMILIES.values() for k in f.media)  # each once
    assert all(not s.protocol for _, s in rows)
    protocol = [(a, s) for a, s, _ in parsed if a.protocol_only]
    assert len(protocol) == 1 and protocol[0][1].protocol
    for a, s, note in parsed:
        with_retry = float(note.split(",")[-1].split()[0]) if "retry" in note else float(note.split()[1])
        assert with_retry <= limit - START_S
    assert merge_line.split()[4:] == [a.json for a, _, _ in parsed] + ["--json", "gpu-check.json"]
    split = [s.families[0] for _, s in rows if len(s.media) == 1 and len(zoo.get_family(s.families[0]).media) > 1]
    if limit == 240:  # LLaVA-1.5's and InternVL3's media (about 67 and 73 s at most) take one command each here
        assert split.count("llava") == 3 and split.count("internvl") == 3
    else:
        assert split == [] and len(rows) == 2


def test_plan_estimates_are_the_h100_report():
    with open(H100_REPORT) as f:
        assert seconds_per_media(json.load(f)) == H100_S
    assert PROCESS_S > 0


def _report(rows, protocol=None, dtype="bf16", wall=10.0):
    return {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "transformers": "5.23.0", "dtype": dtype, "tiny": False,
            "llm_layers": None, "command": "c", "shares": [0.25], "new_tokens": 4, "static_cache": False,
            "methods": ["mi"], "families": [{"family": r["family"], "media": r["media"]} for r in rows[:1]],
            "rows": rows, "protocol": protocol, "wall_s": wall}


def _cell(phase, kind, method, batch, ms, budget="all"):
    return {"phase": phase, "kind": kind, "method": method, "batch": batch, "budget": budget, "median_ms": ms,
            "total_ms": ms, "encode_ms": 0.0, "select_ms": 0.0}


def test_merge_joins_reports(tmp_path):
    a_rows = [dict(r, ok=True) for r in planned_rows("llava", "image", ["mi"], [0.25])]
    b_rows = [dict(r, ok=True) for r in planned_rows("internvl", "video", ["mi"], [0.25])]
    b_rows[1]["ok"], b_rows[1]["error"] = False, "RuntimeError: x"
    p1 = {"cells": [_cell("eager", "latency", "generate", 1, 100.0), _cell("eager", "latency", "mi:lam=1", 1, 60.0)],
          "skipped": [{"phase": "eager", "kind": "view", "method": "one answer", "batch": 1, "why": "budget"}],
          "spent_s": 5.0}
    p2 = {"cells": [_cell("eager", "view", "one answer", 1, 10.0), _cell("eager", "view", "6 answers", 6, 14.0, 64)],
          "skipped": [], "spent_s": 3.0}
    parts = [_report(a_rows, p1), _report(b_rows, p2, wall=20.0)]
    m = merge(parts, ["a.json", "b.json"])
    assert [(r["family"], r["method"]) for r in m["rows"]] == [(r["family"], r["method"]) for r in a_rows + b_rows]
    assert len(m["families"]) == 2 and m["wall_s"] == 30.0 and [x["file"] for x in m["parts"]] == ["a.json", "b.json"]
    g = m["protocol"]["goals"]
    assert g["mi_vs_generate_eager"] == 0.6 and g["six_answers_vs_one"] == 1.4  # from cells of two parts
    assert m["protocol"]["skipped"] == [] and m["protocol"]["spent_s"] == 8.0  # the view cells ran in part 2
    # a later part's row replaces the same row of an earlier part
    again = [dict(b_rows[1], ok=True, error=None)]
    m2 = merge(parts + [_report(again)], ["a.json", "b.json", "c.json"])
    assert len(m2["rows"]) == 4 and all(r["ok"] for r in m2["rows"])
    with pytest.raises(SystemExit, match="dtype"):
        merge([parts[0], _report(b_rows, dtype="fp16")], ["a.json", "b.json"])
    files = []
    for i, part in enumerate(parts):
        files.append(str(tmp_path / f"p{i}.json"))
        with open(files[-1], "w") as f:
            json.dump(part, f)
    out = tmp_path / "all.json"
    assert tools_main(["merge", *files, "--json", str(out)]) == 1  # one failing row
    assert json.loads(out.read_text())["rows"] == m["rows"]
    assert merge_main([files[0]]) == 0
