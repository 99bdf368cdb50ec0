"""`python -m mipruner.bench gpu`: the paper's efficiency protocol at 7B shapes, batch 1 and batched.

Per shape (random weights, `mipruner.models.llava.random_weights.build_random_llava`: LLaVA-1.5-7B =
CLIP ViT-L/14-336 + 32 Llama layers of 4096; LLaVA-NeXT-7B = the same with anyres tiles) and per cell: `--warmup`
untimed runs (10), then mean +- std over `--repeats` timed runs (30) and the peak memory
(`efficiency.PeakMemory`), every answer `--new-tokens` long (2, as for POPE; EOS masked).

Latency, batch 1 (`efficiency.make_run`: encode -> select -> answer, what a user waits for):
  generate          plain transformers: the processor, then `model.generate(**inputs)` of the
                    unpruned model (dynamic cache, no compile): the baseline every row is put against
  none              our unpruned answer (`adapter.generate`, on the chosen decoding path)
  <method> x budget every registered image method (or `--methods`) at 64 / 128 / 192 kept tokens
Throughput, batch B in `--batches` (1, 8, 32), for `--batch-methods`: B items encoded with one
vision-tower call (`mipruner.serve.batch.encode_items`; LLaVA-NeXT's tiles differ per aspect ratio and
are encoded one by one), selected one by one, and answered as ONE batch
(`mipruner.serve.batch.answer_items`: kept sets packed into one prefill; in-LLM methods answer one by one);
`generate` here is `model.generate` on the processor's batch of B prompts. Columns: items/s end to
end, and LLM items/s = B / (time - encode - select).

Decoding path (`--static-cache`, `--bucket`, `--compile`): the adapter's `DecodePath`; prompt
lengths padded to multiples of `--bucket` (64), a static KV cache, and with `--compile` the packed
prefill (at the bucketed length), the decoding step and, for an encoding that records nothing, the
LLaVA-1.5 tower compiled (`common/decode.DecodeEngine.compiled`: CUDA graphs on CUDA, nothing compiled off CUDA; each
new shape compiles once, in the warm-ups).
`--view` runs only the app's view cells instead, as gpu-check's protocol times them
(`view_runs`, which gpu-check's protocol also runs): one answer (the unpruned one) against the six answers of one view
(the unpruned one + mi, random, similarity, attention, divprune at the first `--budgets` entry, one
`mipruner.answer_batch`, selections included) on one cached encoding, and their ratio
`six_answers_vs_one` (the issue's goal: <= 1.5); then what a slider move costs the app, whose answer
cache keeps the unpruned answer of an encoding: the five pruned answers alone (`slider_view_vs_one`);
the model is gpu-check's (`zoo.FAMILIES`).
Methods take `name:param=value` settings, e.g. `mi:lam=1`. `--tiny` shrinks both shapes to a few
layers of width 64 / 128 (tests and CPU smoke runs: timings then mean nothing).
"""
from __future__ import annotations

import time

import torch

import mipruner
from mipruner.serve.batch import answer_items, encode_items, use_decode_path
from mipruner.pruners import get_pruner, list_pruners

from .cli import add_run_options, command_parser, names, parse, write_json
from .efficiency import PROMPT, PeakMemory, make_run, measure_cell, parse_budgets
from .prefill import test_image
from .timing import table

SHAPES = {"llava-1.5-7b": "llava", "llava-next-7b": "llava_next"}
TINY = dict(image_size=56, patch=14, vision_layers=2, vision_width=64, llm_width=128, llm_ffn=256)


def parse_method(entry: str) -> tuple[str, dict]:
    """"mi:lam=1" -> ("mi", {"lam": 1.0}); values are int, float or text."""
    name, *settings = entry.split(":")
    params = {}
    for s in settings:
        k, _, v = s.partition("=")
        for cast in (int, float):
            try:
                v = cast(v)
                break
            except ValueError:
                continue
        params[k.strip()] = v
    get_pruner(name)  # unknown names fail early
    return name, params


def _plain_inputs(adapter, image, batch: int) -> dict:
    from mipruner.models.common.hf_adapter import chat_prompt

    text = chat_prompt(adapter.processor, PROMPT, "image", fallback="USER: <image>\n{prompt} ASSISTANT:")
    inputs = adapter.processor(images=[image] * batch, text=[text] * batch, return_tensors="pt")
    return {k: v.to(adapter.device) for k, v in inputs.items()}


def make_plain_run(adapter, image, new_tokens: int, batch: int = 1):
    """One plain transformers run: processor + `model.generate` of the unpruned model (B prompts)."""
    from mipruner.models.base import Answer

    def run():
        t0 = time.perf_counter()
        inputs = _plain_inputs(adapter, image, batch)
        t1 = time.perf_counter()
        out = adapter.model.generate(**inputs, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                     pad_token_id=adapter.tokenizer.pad_token_id)
        t2 = time.perf_counter()
        n_in = int(inputs["input_ids"].shape[1])
        ids = out[0, n_in:].tolist()
        ans = Answer(text="", token_ids=ids, input_tokens=n_in, visual_tokens=-1, prefill_s=float("nan"),
                     decode_s=float("nan"))
        return ans, {"encode_s": t1 - t0, "select_s": 0.0, "prefill_s": float("nan"), "decode_s": float("nan"),
                     "total_s": t2 - t0}

    return run


def make_batch_run(adapter, image, method: str, budget, new_tokens: int, params: dict, batch: int):
    """B items: encode them (one tower call where the family batches it), select them (one batched call where
    the method allows it, `select_batch`), answer all as one batch (`answer_items`)."""
    asked = mipruner.signals_for([] if method == "none" else [method])  # what the method reads
    gen = adapter.fixed_length_kwargs(new_tokens)

    def run():
        t0 = time.perf_counter()
        encs = encode_items(adapter, [(image, PROMPT)] * batch, batch=batch, signals=asked)
        t1 = time.perf_counter()
        sels = ([None] * len(encs) if method == "none" else  # one batched call where the method allows it
                mipruner.select_batch(adapter, encs, method, budget, strict=False, **params))
        t2 = time.perf_counter()
        answers = answer_items(adapter, list(zip(encs, sels)), max_new_tokens=new_tokens, max_batch=batch, **gen)
        t3 = time.perf_counter()
        a = answers[0]
        return a, {"encode_s": t1 - t0, "select_s": t2 - t1, "prefill_s": a.prefill_s, "decode_s": a.decode_s,
                   "total_s": t3 - t0}

    return run


def run_shape(adapter, methods: list[tuple[str, dict]], budgets: list, batches: list[int],
              batch_methods: list[tuple[str, dict]], repeats: int, warmup: int, new_tokens: int,
              log=print) -> tuple[list[dict], list[dict]]:
    """(latency rows, throughput rows) for one model; ratios to the plain `generate` row / `none`."""
    image = test_image(int(adapter.config.vision_config.image_size))
    mem = PeakMemory(adapter.device)
    sync = (lambda: torch.cuda.synchronize(adapter.device)) if adapter.device.type == "cuda" else (lambda: None)  # noqa: E731

    def cell(run, label, budget, batch=1):
        r = measure_cell(run, repeats, warmup, mem, sync)
        if r["new_tokens"] != new_tokens:
            raise RuntimeError(f"{label} decoded {r['new_tokens']} tokens, not {new_tokens}")
        r.update(method=label, budget=budget, batch=batch)
        log(f"  {label:>16} {str(budget):>5} x{batch:<3}: {r['total_ms']:.1f} +- {r['std_ms']:.1f} ms, "
            f"peak {r['peak_mb']:.0f} MB")
        return r

    latency = []
    with torch.inference_mode():
        latency.append(cell(make_plain_run(adapter, image, new_tokens), "generate", "all"))
        latency.append(cell(make_run(adapter, image, "none", "all", new_tokens, {}), "none", "all"))
        for name, params in methods:
            label = _label(name, params)
            for b in budgets:
                latency.append(cell(make_run(adapter, image, name, b, new_tokens, params), label, b))
        throughput = []
        for B in batches:
            throughput.append(cell(make_plain_run(adapter, image, new_tokens, B), "generate", "all", B))
            throughput.append(cell(make_batch_run(adapter, image, "none", "all", new_tokens, {}, B), "none", "all", B))
            for name, params in batch_methods:
                for b in budgets:
                    throughput.append(cell(make_batch_run(adapter, image, name, b, new_tokens, params, B),
                                           _label(name, params), b, B))
    plain, none = latency[0]["total_ms"], latency[1]["total_ms"]
    for r in latency:
        r["vs_generate"], r["vs_none"] = r["total_ms"] / plain, r["total_ms"] / none
    for r in throughput:
        r["items_s"] = r["batch"] / (r["total_ms"] / 1e3)
        llm_ms = r["total_ms"] - r["encode_ms"] - r["select_ms"]
        r["llm_items_s"] = r["batch"] / (llm_ms / 1e3) if llm_ms > 0 else float("nan")
    for r in throughput:
        base = next(x for x in throughput if x["method"] == "none" and x["batch"] == r["batch"])
        r["llm_vs_none"] = r["llm_items_s"] / base["llm_items_s"]
    return latency, throughput


VIEW = ("mi", "random", "similarity", "attention", "divprune")  # + the unpruned answer: the app's six panels


def view_runs(adapter, image, budget: int, new_tokens: int):
    """(one answer, six answers, a slider move, n) on one cached encoding, as the app answers one view
    and as gpu-check's protocol times it: the unpruned answer alone; the selections of VIEW (cold
    cache) and the unpruned + pruned answers in one `mipruner.answer_batch` (the first view of an
    encoding); the same without the unpruned row (a later view: the app's answer cache holds the
    unpruned answer, `mipruner.serve.answer_cache`, so a slider move answers the pruned rows only)."""
    from mipruner.serve.batch import answer_batch

    methods = [m for m in VIEW if m in list_pruners()]
    enc = mipruner.encode_for(adapter, image, PROMPT, methods)  # with what the view's methods read
    force = adapter.fixed_length_kwargs(new_tokens)

    def one():
        t0 = time.perf_counter()
        a = adapter.generate(enc, None, max_new_tokens=new_tokens, **force)
        return a, {"encode_s": 0.0, "select_s": 0.0, "prefill_s": a.prefill_s, "decode_s": a.decode_s,
                   "total_s": time.perf_counter() - t0}

    def rows(reference: bool):
        def run():
            t0 = time.perf_counter()
            cache: dict = {}
            sels = [mipruner.select(adapter, enc, m, budget, cache=cache, strict=False) for m in methods]
            t1 = time.perf_counter()
            got = answer_batch(adapter, enc, [None, *sels] if reference else sels, max_new_tokens=new_tokens,
                               cache=cache, **force)
            return got[0], {"encode_s": 0.0, "select_s": t1 - t0, "prefill_s": got[0].prefill_s,
                            "decode_s": got[0].decode_s, "total_s": time.perf_counter() - t0}
        return run

    return one, rows(True), rows(False), len(methods) + 1


VIEW_CELLS = ("one answer", "{n} answers", "{m} answers (slider)")  # the labels of the view cells


def view_goals(one_ms: float | None, six_ms: float | None, moved_ms: float | None) -> dict:
    """`six_answers_vs_one` (the first view of an encoding) and `slider_view_vs_one` (a later view) from
    the cells' medians; None where a cell is missing."""
    ratio = lambda a: round(a / one_ms, 3) if one_ms and a else None  # noqa: E731
    return {"six_answers_vs_one": ratio(six_ms), "slider_view_vs_one": ratio(moved_ms)}


def run_view(adapter, budget: int, repeats: int, warmup: int, new_tokens: int, log=print) -> list[dict]:
    """The view cells (module docstring): [one answer, six answers, a slider move], the second with
    `six_answers_vs_one`, the third with `slider_view_vs_one`."""
    image = test_image(int(adapter.config.vision_config.image_size))
    mem = PeakMemory(adapter.device)
    sync = (lambda: torch.cuda.synchronize(adapter.device)) if adapter.device.type == "cuda" else (lambda: None)  # noqa: E731
    rows = []
    with torch.inference_mode():
        one, six, moved, n = view_runs(adapter, image, budget, new_tokens)
        for run, label, b, batch in ((one, VIEW_CELLS[0], "all", 1), (six, VIEW_CELLS[1].format(n=n), budget, n),
                                     (moved, VIEW_CELLS[2].format(m=n - 1), budget, n - 1)):
            r = measure_cell(run, repeats, warmup, mem, sync)
            r.update(method=label, budget=b, batch=batch, kind="view")
            log(f"  {label:>20} {str(b):>5}: median {r['median_ms']:.1f} ms (mean {r['total_ms']:.1f} +- "
                f"{r['std_ms']:.1f}), select {r['select_ms']:.1f} ms")
            rows.append(r)
    g = view_goals(*(r["median_ms"] for r in rows))
    rows[1]["six_answers_vs_one"], rows[2]["slider_view_vs_one"] = g["six_answers_vs_one"], g["slider_view_vs_one"]
    log(f"  six_answers_vs_one {g['six_answers_vs_one']:.3f}, slider_view_vs_one {g['slider_view_vs_one']:.3f} "
        "(medians)")
    return rows


def _label(name: str, params: dict) -> str:
    return name + "".join(f":{k}={v}" for k, v in params.items())


def _ms(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def format_latency(rows: list[dict]) -> str:
    body = [[r["method"], str(r["budget"]), str(r["llm_tokens"]), f"{r['total_ms']:.1f} ± {r['std_ms']:.1f}",
             f"{r['vs_generate']:.2f}", f"{r['vs_none']:.2f}", _ms(r["encode_ms"]), _ms(r["select_ms"], 2),
             _ms(r["prefill_ms"]), _ms(r["decode_ms"]), f"{r['peak_mb']:.0f}"] for r in rows]
    return table(body, ["method", "budget", "LLM tokens", "total ms", "vs generate", "vs none", "encode", "select",
                        "prefill", "decode", "peak MB"])


def format_throughput(rows: list[dict]) -> str:
    body = [[r["method"], str(r["budget"]), str(r["batch"]), f"{r['total_ms']:.1f} ± {r['std_ms']:.1f}",
             f"{r['items_s']:.1f}", f"{r['llm_items_s']:.1f}", f"{r['llm_vs_none']:.2f}", f"{r['peak_mb']:.0f}"]
            for r in rows]
    return table(body, ["method", "budget", "batch", "total ms", "items/s", "LLM items/s", "LLM vs none", "peak MB"])


def _methods(text: str) -> list[tuple[str, dict]]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names == ["all"]:  # the video methods (EVS) need a video: name them
        names = [m for m in list_pruners() if not get_pruner(m).video]
    return [parse_method(m) for m in names if m != "none"]


def compile_counts(adapter) -> dict:
    """The compiled path's counts: graphs dynamo compiled in this process (`torch._dynamo.utils.counters`
    "stats"/"unique_graphs"; the caller takes differences) and, per compiled function, how many
    (rows, width) buckets it ran (`adapter.decode_state`; none for adapter None)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "buckets": adapter.decode_state.counts() if adapter is not None else {}}


def main(argv=None) -> list[dict]:
    p = command_parser("gpu", __doc__)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    p.add_argument("--methods", default="all", help="'all' (every registered method) or names, e.g. mi:lam=1,random")
    p.add_argument("--budgets", default="64,128,192")
    p.add_argument("--batches", default="1,8,32", help="batch sizes for items per second ('' for none)")
    p.add_argument("--batch-methods", default="mi:lam=1,mi,similarity,random", help="methods of the batched rows")
    add_run_options(p, repeats=30, warmup=10, device=None, dtype="bf16", json_help="write every row to this JSON file")
    p.add_argument("--new-tokens", type=int, default=2)
    p.add_argument("--llm-layers", type=int, default=32)
    p.add_argument("--tiny", action="store_true", help="tiny widths (tests, CPU smoke runs)")
    p.add_argument("--static-cache", action="store_true", help="static KV cache + bucketed lengths")
    p.add_argument("--bucket", type=int, default=64, help="length bucket of the static path")
    p.add_argument("--compile", action="store_true", help="compile the packed prefill and the decoding step (implies --static-cache)")
    p.add_argument("--view", action="store_true",
                   help="only the view cells: one answer vs the six answers of one view (six_answers_vs_one)")
    a = parse(p, argv)
    shapes = names(a.shapes)
    for s in shapes:
        if s not in SHAPES:
            raise ValueError(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    methods, batch_methods = _methods(a.methods), _methods(a.batch_methods)
    batches = [int(b) for b in a.batches.split(",") if b.strip()]
    dtype, device = a.torch_dtype, a.device
    from mipruner.models.llava.random_weights import build_random_llava

    out, compiles = [], {}
    if a.view:
        from .zoo import get_family

        for shape in shapes:
            t0 = time.perf_counter()
            ad, desc = get_family(SHAPES[shape]).build(tiny=a.tiny, device=device, dtype=dtype, llm_layers=a.llm_layers)
            print(f"{shape}: {desc} (built in {time.perf_counter() - t0:.0f} s); device {device}; view cells, "
                  f"{a.warmup} warm-up + {a.repeats} timed runs each, {a.new_tokens} new tokens")
            out += [dict(r, shape=shape) for r in run_view(ad, parse_budgets(a.budgets)[0], a.repeats, a.warmup,
                                                           a.new_tokens)]
            del ad
        shapes = []
    for shape in shapes:
        t0 = time.perf_counter()
        graphs_before = compile_counts(None)["graphs"]
        ad, desc = build_random_llava(llm_layers=a.llm_layers, dtype=dtype, family=SHAPES[shape], device=device,
                                      **(TINY if a.tiny else {}))
        if a.static_cache or a.compile:
            use_decode_path(ad, bucket=a.bucket, static_cache=True, compile=a.compile)
        print(f"{shape}: {desc} (built in {time.perf_counter() - t0:.0f} s); device {device}, decoding path "
              f"{ad.decode_path}; {a.warmup} warm-up + {a.repeats} timed runs per cell, {a.new_tokens} new tokens")
        latency, throughput = run_shape(ad, methods, parse_budgets(a.budgets), batches, batch_methods, a.repeats,
                                        a.warmup, a.new_tokens)
        print(f"memory: {PeakMemory(device).kind}\n\nbatch 1\n{format_latency(latency)}")
        if throughput:
            print(f"\nitems per second\n{format_throughput(throughput)}")
        counts = compile_counts(ad)
        compiles[shape] = dict(counts, graphs=counts["graphs"] - graphs_before)
        print(f"\ncompiled path: {compiles[shape]['graphs']} graphs compiled; (rows, width) buckets run per "
              f"compiled function: {compiles[shape]['buckets'] or 'none (not compiled)'}")
        out += [dict(r, shape=shape, kind="latency") for r in latency]
        out += [dict(r, shape=shape, kind="throughput") for r in throughput]
        del ad
    write_json(a.json, {"device": str(device), "dtype": a.dtype, "static_cache": a.static_cache or a.compile,
                        "compile": a.compile, "bucket": a.bucket, "new_tokens": a.new_tokens, "rows": out,
                        "compiles": compiles})
    return out
