"""`python -m mipruner.bench ops`: what one selection costs in launches, and captured vs eager time.

For every pre-LLM method (MI at lam 1 and 0.5 counted apart), on random inputs of N_V visual tokens
(default 576), width d (default 4096), N_T prompt tokens and a budget K (default 64):

  ops        top-level aten ops of one `mipruner.prune` call (torch profiler; an op called by
             another op is not counted again). On a GPU each is at least one kernel launch, a few
             microseconds of host time in eager mode: the count is the launch cost a captured
             selection (one graph replay) saves. Counted in eager mode, capture off.
  eager ms   median wall time of `mipruner.prune` with capture off (`capture.disabled()`).
  captured   median wall time of the same call with capture on: on CUDA, the first call of a
             (method, shapes, K, parameters) records a CUDA graph and later calls replay it
             (`mipruner.pruners.capture`); on the CPU there is nothing to capture, so the column
             shows `torch.compile(fullgraph=True)` of the call with `--cpu-backend` (default
             "none": not timed; "inductor" needs a C++ compiler and minutes per method), for the
             methods capturable at that N_V; a call that does not trace as one graph shows
             "graph break" (its error in the JSON's `captured_error`); the video methods, whose frame
             table is host work (static in a CUDA graph), are not compiled: "-".
  same       whether the captured call keeps the same tokens (keep and order) as the eager one.

`--batch B` adds, per method, the selections of B items (random inputs of one shape, seeds 0..B-1):
one by one (B `mipruner.prune` calls) against one `mipruner.prune_batch` call (one `torch.vmap` call, one
CUDA graph on CUDA, where the method declares it batches), both with capture on, in ms per item, and
whether the batched call keeps each item's tokens. Methods that do not batch show "-".

Cells are timed round-robin (one call of each method per round) after warm-up, with
`torch.cuda.synchronize()` around every call on CUDA. Methods that read attention get a
(N_V+1, N_V+1) softmax matrix with [CLS] first and keys (N_V+1, 64), on the inputs' device.
"""
from __future__ import annotations

import inspect
import statistics
import time

import torch

import mipruner
from mipruner.pruners import capture, get_pruner

from .cli import add_run_options, command_parser, names, parse, write_json
from .pruners import make_inputs
from .timing import table


def variants(methods: list[str], video: bool = False, per_frame: str = "off") -> list[tuple[str, str, dict]]:
    """(label, pruner name, extra parameters): MI at lam 1 and lam 0.5 apart; on a video (`video`), EVS at the
    rate of the latency cells (`video.RATE`) and every other method with `per_frame` (its per-frame budgets:
    off, even or uniqueness) where that is not "off"."""
    from .video import RATE

    out = []
    for m in methods:
        if video and m == "evs":
            out.append((f"evs vpr={RATE:g}", "evs", {"video_pruning_rate": RATE}))
            continue
        mine = [("mi lam=1", "mi", {"lam": 1.0}), ("mi lam=0.5", "mi", {"lam": 0.5})] if m == "mi" else [(m, m, {})]
        if video and per_frame != "off" and not get_pruner(m).video:
            mine = [(f"{label} per_frame={per_frame}", name, {**extra, "per_frame": per_frame})
                    for label, name, extra in mine]
        out += mine
    return out


def top_level_ops(fn) -> int:
    """The number of aten ops `fn()` calls directly (ops called by another aten op are not counted)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    n = 0
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        parent = ev.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        n += parent is None
    return n


def _call(name: str, data: dict, k: int, extra: dict):
    """A zero-argument `mipruner.prune` call of `name` on the inputs it takes from `data`."""
    sig = inspect.signature(get_pruner(name).fn).parameters
    kw = {key: val for key, val in data.items() if key in sig}
    return lambda: mipruner.prune(name, budget=k, **kw, **extra)


def _median_ms(calls: dict, repeats: int, sync) -> dict[str, float]:
    times: dict[str, list[float]] = {label: [] for label in calls}
    for r in range(repeats + 2):  # two warm-up rounds (the first captures)
        for label, fn in calls.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if r >= 2:
                times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def run(n_v: int, dim: int, n_text: int, k: int, methods: list[str], repeats: int, device="cpu",
        dtype=torch.float32, cpu_backend: str = "none", log=print, batch: int = 1, data: dict | None = None,
        video: dict | None = None, per_frame: str = "off") -> list[dict]:
    """The table above on random inputs of N_V = n_v (`data`: given inputs instead, e.g. a video's; `video`:
    its layout, `video.Layout.as_dict()`, recorded in every row)."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    data = make_inputs(n_v, dim, n_text, 0, True, device, dtype) if data is None else data
    labels = variants(methods, video is not None, per_frame)
    calls = {label: _call(name, data, k, extra) for label, name, extra in labels}
    with capture.disabled():
        ops = {label: top_level_ops(fn) for label, fn in calls.items()}
        eager = _median_ms(calls, repeats, sync)
        ref = {label: fn() for label, fn in calls.items()}
    if device.type == "cuda":
        captured_calls = calls
    elif cpu_backend != "none":
        # dynamic=False: the labels share one lambda code object, whose parameters (MI lam 1 then 0.5) must
        # not turn into symbolic floats on the second compile
        # only the methods that declare themselves one capturable computation here (`capture.capturable`)
        captured_calls = {label: torch.compile(fn, fullgraph=True, backend=cpu_backend, dynamic=False)
                          for (label, name, extra), fn in zip(labels, calls.values())
                          if capture.capturable(name, n_v, extra) and not get_pruner(name).video}
    else:
        captured_calls = {}
    # every label's compiled call enters `mipruner.prune`'s one code object: room for one entry per label, in
    # this block only (dynamo's recompile limit, 8 by default, would fail the ninth label under fullgraph)
    broken = {}  # label -> why its compiled call failed (a graph break under fullgraph): reported, not raised
    with torch._dynamo.config.patch(recompile_limit=len(labels) + 8):
        for label in list(captured_calls):
            try:
                captured_calls[label]()
            except Exception as e:  # noqa: BLE001  one method's failure is its row's, the others still run
                broken[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                del captured_calls[label]
        captured = _median_ms(captured_calls, repeats, sync) if captured_calls else {}
        got = {label: fn() for label, fn in captured_calls.items()}
    rows, out = [], []
    for label, _name, _extra in labels:
        same = None
        if label in got:
            s = got[label]
            same = torch.equal(s.keep.cpu(), ref[label].keep.cpu()) and torch.equal(s.order.cpu(), ref[label].order.cpu())
        c = captured.get(label)
        rows.append([label, str(ops[label]), f"{eager[label]:.2f}",
                     ("graph break" if label in broken else "-") if c is None else f"{c:.2f}",
                     "-" if c is None else f"{eager[label] / c:.1f}", "-" if same is None else ("yes" if same else "NO")])
        out.append(dict(method=label, n_v=n_v, d=dim, n_t=n_text, k=k, ops=ops[label], eager_ms=eager[label],
                        captured_ms=c, same_tokens=same, device=str(device), dtype=str(dtype).replace("torch.", ""),
                        captured_error=broken.get(label), **({"video": video} if video else {})))
    if batch > 1:
        _batch_columns(labels, rows, out, n_v, dim, n_text, k, batch, repeats, device, dtype, sync)
    how = "CUDA graph replay" if device.type == "cuda" else (f"torch.compile backend={cpu_backend}"
                                                             if cpu_backend != "none" else "not timed on the CPU")
    where = (f"{video['family']} video of {video['frames']} frames: {video['token_frames']} frames of "
             f"{video['per_frame']} tokens + {video['outside']} of no frame; ") if video else ""
    log(f"{where}N_V={n_v}  d={dim}  N_T={n_text}  K={k}  {device} {str(dtype).replace('torch.', '')}  "
        f"(torch threads {torch.get_num_threads()}, {repeats} round-robin rounds; captured: {how})")
    head = ["method", "aten ops", "eager ms", "captured ms", "speed-up", "same tokens"]
    if batch > 1:
        head += [f"{batch} one by one ms/item", f"{batch} batched ms/item", "batched speed-up", "batched same"]
    log(table(rows, head))
    return out


def _batch_columns(labels, rows, out, n_v, dim, n_text, k, batch, repeats, device, dtype, sync) -> None:
    """One by one against `prune_batch` on `batch` items (module doc): columns appended to `rows` / `out`."""
    items = [make_inputs(n_v, dim, n_text, seed, True, device, dtype) for seed in range(batch)]
    singles, batched = {}, {}
    for label, name, extra in labels:
        spec = get_pruner(name)
        if spec.capture is None or not spec.capture.batch:
            continue
        kws = [{key: val for key, val in it.items() if key in ("visual", "text", *spec.inputs)} for it in items]
        lists = {key: [kw[key] for kw in kws] for key in kws[0]}
        singles[label] = lambda kws=kws, name=name, extra=extra: [mipruner.prune(name, budget=k, **kw, **extra)
                                                                  for kw in kws]
        batched[label] = lambda lists=lists, name=name, extra=extra: mipruner.prune_batch(name, budget=k, **lists,
                                                                                          **extra)
    one, many = _median_ms(singles, repeats, sync), _median_ms(batched, repeats, sync)
    for row, rec, (label, _name, _extra) in zip(rows, out, labels):
        if label not in batched:
            row += ["-"] * 4
            continue
        same = all(torch.equal(a.keep, b.keep) and torch.equal(a.order, b.order)
                   for a, b in zip(batched[label](), singles[label]()))
        row += [f"{one[label] / batch:.2f}", f"{many[label] / batch:.2f}", f"{one[label] / many[label]:.1f}",
                "yes" if same else "NO"]
        rec.update(batch=batch, one_by_one_ms_per_item=one[label] / batch, batched_ms_per_item=many[label] / batch,
                   batched_same_tokens=same)


def run_video(a, p) -> list[dict]:
    """`--video-frames`: the table for each frame count of `--video-family`'s video (mipruner.bench.video)."""
    from . import video as V

    methods = names(a.methods) if a.methods else list(V.METHODS)
    adapter, _ = V.build(a.video_family, tiny=a.tiny, device="meta", llm_layers=1)  # the layout reads the config only
    rows = []
    for frames in V.parse_frames(a.video_frames):
        lay = V.layout(adapter, a.video_family, frames, a.tiny)
        data = V.inputs(lay, a.text, attention=bool(mipruner.signals_for(methods).attention), device=a.device,
                        dtype=a.torch_dtype)
        rows += run(lay.n_visual, lay.hidden, a.text, V.retained(lay), methods, a.repeats, a.device, a.torch_dtype,
                    a.cpu_backend, batch=1, data=data, video=lay.as_dict(), per_frame=a.per_frame)
    write_json(a.json, rows)
    return rows


def main(argv=None) -> None:
    p = command_parser("ops", __doc__)
    p.add_argument("--n-v", type=int, default=576)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--text", type=int, default=32, help="N_T, prompt tokens")
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--methods", default=None, help="pre-LLM methods (default: all of them; with --video-frames "
                   "the video ones)")
    add_run_options(p, repeats=9, repeats_help="timed round-robin rounds (after two warm-up rounds)", device="cpu",
                    dtype="fp32", json_help="also write the rows as JSON to this file")
    p.add_argument("--cpu-backend", default="none", help="on the CPU: torch.compile backend for the captured column "
                   "(none: not timed; eager: dynamo only; inductor)")
    p.add_argument("--batch", type=int, default=1, help="B > 1: also one by one against prune_batch on B items")
    p.add_argument("--video-frames", default=None, help="e.g. 8,16,32: a video of each frame count instead of "
                   "--n-v / --dim (mipruner.bench.video): N_V, frames and d as the family's processor and config "
                   "give them; budget: EVS's retained tokens at q = 0.75 (--budget ignored); default methods: the "
                   "video ones")
    p.add_argument("--video-family", default="qwen2_5_vl", help="qwen2_5_vl or llava_onevision")
    p.add_argument("--tiny", action="store_true", help="with --video-frames: the family's tiny config (tests)")
    p.add_argument("--per-frame", default="off", choices=("off", "even", "uniqueness"),
                   help="with --video-frames: the image methods of --methods with this per-frame budget split")
    a = parse(p, argv)
    if a.video_frames:
        return run_video(a, p)
    methods = names(a.methods or ",".join(mipruner.list_pruners("projector") + mipruner.list_pruners("vision")))
    for m in methods:
        if get_pruner(m).stage == "llm":
            p.error(f"{m!r} selects inside the LLM: time it with `python -m mipruner.bench efficiency`")
    rows = run(a.n_v, a.dim, a.text, a.budget, methods, a.repeats, a.device, a.torch_dtype, a.cpu_backend,
               batch=a.batch)
    write_json(a.json, rows)
