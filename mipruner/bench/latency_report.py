"""The goals of issues 40 and 41 restated against `bench latency`'s anchors, and its printed report.

Goals (H100, LLaVA-1.5-7B shape, bf16; each a ratio of medians of one run, None where a cell is missing):
  mi_ttft_vs_generate_static   MI@64's time to first token over static-compiled `generate`'s    <= 0.5
  mi_ttft_vs_floor             MI@64's time to first token over its floor                         <= 1.5
  decode_vs_weight_floor       per-token decode at batch 1 (ours, MI and unpruned, compiled
                               phase, the longest answer) over the weight-bandwidth floor         <= 1.3
  six_answers_vs_one_n2 / _n32 one view's six answers over one answer, 2 / 32 new tokens          <= 1.45 / 1.2
  batch_none_vs_generate       our unpruned batch's items/s over the best `generate`'s            >= 1.0
  batch_mi_vs_generate         MI@64's batch items/s over the best `generate`'s                   >= 4
  select_max_ms                the slowest pre-LLM selection at N_V (median)                      <= 0.5
  encode_ms_per_image_b1 / _bB the encode per image at batch 1 / at the batch size                <= 6 / 1.5
The time-to-first-token and decode goals are taken in the compiled phase (the GPU path). A ratio compares
cells of one interleaved group only: the batch goals compare ours with the `generate` of the same phase
(eager: `generate`; compiled: the static `generate`), and the goal is the lower of the phases' ratios
(`batch_by_phase` has each). Every ratio is printed with its floor: the same ratio of the cells' floors.
"""
from __future__ import annotations

from .floors import floor_ratio
from .stats import ratio_text
from .timing import table

TARGETS = {"mi_ttft_vs_generate_static": "<= 0.5", "mi_ttft_vs_floor": "<= 1.5", "decode_vs_weight_floor": "<= 1.3",
           "six_answers_vs_one_n2": "<= 1.45", "six_answers_vs_one_n32": "<= 1.2", "batch_none_vs_generate": ">= 1.0",
           "batch_mi_vs_generate": ">= 4", "select_max_ms": "<= 0.5", "encode_ms_per_image_b1": "<= 6",
           "encode_ms_per_image_bB": "<= 1.5"}


def _find(cells, **kw):
    return next((c for c in cells if all(c.get(k) == v for k, v in kw.items())), None)


def _med(c, key="total_ms"):
    return c[key]["median"] if c and c.get(key) else None


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def _group(c) -> tuple:
    """The interleaved group a cell ran in: its phase and group (one answer length, or the batch cells)."""
    return c.get("phase"), c.get("group", "batch" if c.get("kind") in ("batch", "encode") else f"n={c.get('length')}")


def goals(cells: list[dict]) -> dict:
    """The goals' values, each a ratio of medians of cells of ONE interleaved group, and under "floors" each
    ratio's floor (`floors.floor_ratio`: the same ratio of the cells' floors, in ms or FLOPs)."""
    out: dict = {k: None for k in TARGETS}
    fl: dict = {}
    lat = [c for c in cells if c.get("kind") == "latency" and c.get("phase") == "compiled"]
    lengths = sorted({c["length"] for c in lat})
    if lengths:
        n0, nl = lengths[0], lengths[-1]
        mi, gen = _find(lat, method="ours-mi", length=n0), _find(lat, method="generate-static", length=n0)
        out["mi_ttft_vs_generate_static"] = _ratio(_med(mi, "ttft_ms"), _med(gen, "ttft_ms"))
        fl["mi_ttft_vs_generate_static"] = floor_ratio((mi or {}).get("floor"), (gen or {}).get("floor"), "ttft")
        out["mi_ttft_vs_floor"] = _ratio(_med(mi, "ttft_ms"), (mi or {}).get("floor", {}).get("ttft_ms"))
        if out["mi_ttft_vs_floor"] is not None:
            fl["mi_ttft_vs_floor"] = (1.0, "ms")  # a ratio to the floor itself
        out["decode_vs_weight_floor"] = {
            m: _ratio(_med(c, "decode_ms_per_token"), c.get("floor", {}).get("decode_weight_ms"))
            for m in ("ours-mi", "ours-none", "generate-static") if (c := _find(lat, method=m, length=nl))}
        if any(v is not None for v in out["decode_vs_weight_floor"].values()):
            fl["decode_vs_weight_floor"] = (1.0, "ms")
    for n in (2, 32):
        view = [c for c in cells if c.get("kind") == "view" and c.get("length") == n]
        one = next((c for c in view if c["batch"] == 1), None)
        six = next((c for c in view if c["batch"] > 1), None)
        out[f"six_answers_vs_one_n{n}"] = _ratio(_med(six), _med(one))
        fl[f"six_answers_vs_one_n{n}"] = floor_ratio((six or {}).get("floor"), (one or {}).get("floor"), "total")
    # the batch goals: ours against `generate` in the same interleaved group (one phase's batch cells), never
    # against a generate cell of another phase; the goal is the lower of the phases' ratios
    by_phase: dict = {}
    for group in dict.fromkeys(_group(c) for c in cells if c.get("kind") == "batch"):
        mine = [c for c in cells if c.get("kind") == "batch" and _group(c) == group]
        gen = next((c for c in mine if c["method"].startswith("generate")), None)
        if gen is None:
            continue
        row = {"generate": gen["method"]}
        for m, key in (("ours-none", "none"), ("ours-mi", "mi")):
            c = _find(mine, method=m)
            if c:  # items/s ratio = time ratio inverted
                row[key] = _ratio(_med(gen), _med(c))
                row[f"{key}_floor"] = floor_ratio(gen.get("floor"), c.get("floor"), "total")
        by_phase[group[0]] = row
    for m, key in (("none", "batch_none_vs_generate"), ("mi", "batch_mi_vs_generate")):
        got = [(r[m], r[f"{m}_floor"]) for r in by_phase.values() if r.get(m) is not None]
        if got:
            out[key], fl[key] = min(got, key=lambda x: x[0])
    out["batch_by_phase"] = by_phase
    sel = [c for c in cells if c.get("kind") == "select"]
    out["select_max_ms"] = round(max(_med(c) for c in sel), 3) if sel else None
    out["select_over_0_5ms"] = [c["method"] for c in sel if _med(c) > 0.5]
    enc = sorted((c for c in cells if c.get("kind") == "encode"), key=lambda c: c["batch"])
    out["encode_ms_per_image_b1"] = round(_med(enc[0], "per_image_ms"), 3) if enc else None
    out["encode_ms_per_image_bB"] = round(_med(enc[-1], "per_image_ms"), 3) if len(enc) > 1 else None
    out["floors"] = {k: {"ratio": v[0], "basis": v[1]} for k, v in fl.items()}
    out["targets"] = TARGETS
    return out


def floor_text(f) -> str:
    """'floor 0.506 (FLOPs)' for a (ratio, basis) or {'ratio', 'basis'}; 'floor -' when unknown."""
    ratio, basis = (f.get("ratio"), f.get("basis")) if isinstance(f, dict) else (f or (None, None))
    return "floor -" if ratio is None else f"floor {ratio:.3f} ({basis})"


def ci(m: dict | None, digits: int = 1) -> str:
    """'12.3 [11.9-12.8]': a median and its interval (no interval: the median alone)."""
    if not m:
        return "-"
    f = f"{{:.{digits}f}}"
    if m.get("low") is None:
        return f.format(m["median"])
    return f"{f.format(m['median'])} [{f.format(m['low'])}-{f.format(m['high'])}]"


def _f(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def format_report(report: dict) -> str:
    cells = report["cells"]
    rows = []
    for c in cells:
        if c["kind"] == "select":
            continue
        fl = c.get("floor") or {}
        rows.append([c["phase"], c["kind"], c["method"] + (f"@{c['budget']}" if c["budget"] != "all" else ""),
                     str(c["length"]), str(c["batch"]), str(c.get("prompt_tokens") or "-"), ci(c.get("total_ms")),
                     ci(c.get("ttft_ms")), ci(c.get("decode_ms_per_token"), 2), _f(fl.get("ttft_ms"), 2),
                     _f(fl.get("decode_step_ms"), 2),
                     _f(_ratio(_med(c, "ttft_ms"), fl.get("ttft_ms")), 2) if fl.get("ttft_ms") else "-",
                     f"{c['compiles_warmup']}/{c['compiles_timed']}", _f(c.get("reserved_mb"), 0)])
    head = ["phase", "kind", "cell", "new", "batch", "prompt", "total ms", "TTFT ms", "decode ms/token",
            "floor TTFT", "floor step", "TTFT/floor", "compiles warm/timed", "reserved MB"]
    lines = [f"device {report['device']} ({report['dtype']}), {report['model']}; N_V {report['n_visual']}, "
             f"MI and view at {report['budget']} tokens",
             f"device figures: {report['device_figures']['source']}",
             f"timer: {report['timer']}; {report['repeats']} interleaved rounds after {report['warmup']} warm-up "
             f"rounds, {report['inputs']} varied (image, prompt) pairs; medians [95% {report['interval']}]",
             "", table(rows, head)]
    sel = [c for c in cells if c["kind"] == "select"]
    if sel:
        lines.append("\nselect (ms at " + f"{sel[0]['budget']} of {sel[0]['n_visual']}; MI as the MI cells run it): "
                     + ", ".join(f"{c.get('label', c['method'])} {ci(c['total_ms'], 3)}" for c in sel))
    anchors = []
    for n in report["lengths"]:
        for phase, gen in (("eager", "generate"), ("compiled", "generate-static")):
            g = _find(cells, phase=phase, kind="latency", method=gen, length=n)
            for m in ("ours-none", "ours-mi"):
                c = _find(cells, phase=phase, kind="latency", method=m, length=n)
                if g and c:
                    total = floor_text(floor_ratio(c.get("floor"), g.get("floor"), "total"))
                    ttft = floor_text(floor_ratio(c.get("floor"), g.get("floor"), "ttft"))
                    anchors.append(f"  n={n} {phase}: {m} / {gen}: total {ratio_text(c['total_ms'], g['total_ms'])} "
                                   f"[{total}]" + (f", TTFT {ratio_text(c['ttft_ms'], g['ttft_ms'])} [{ttft}]"
                                                   if c.get("ttft_ms") and g.get("ttft_ms") else ""))
    if anchors:
        lines += ["\nagainst the anchors (median ratio, range from the intervals' ends; [the same ratio of the "
                  "cells' floors]):", *anchors]
    g = report.get("goals") or {}
    floors = g.get("floors") or {}
    lines.append("\ngoals: " + ", ".join(f"{k} {g.get(k)} [{floor_text(floors.get(k))}] (target {t})"
                                         if k in floors else f"{k} {g.get(k)} (target {t})"
                                         for k, t in TARGETS.items()))
    return "\n".join(lines)
