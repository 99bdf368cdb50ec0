"""`python -m mipruner.bench efficiency`: end-to-end latency and peak memory per method x budget.

One run = what a user waits for: vision encode (processor + tower + embeddings) -> selection ->
prefill -> greedy decoding of exactly `--new-tokens` tokens (EOS is masked until then:
`min_new_tokens` for LLaVA-family `generate` and for `inllm.generate`, no EOS for the Qwen loop),
so every method decodes the same length. Methods:

  none              the unpruned model (`adapter.generate`)
  pre-LLM pruners   `mipruner.prune(...)` on the encoding, then `adapter.generate(keep=...)`
                    (default parameters; a fresh per-encoding cache each run: nothing carried over)
  fastv, dart       `inllm.select` (layers 0..K-1 on the full prompt, once) then `inllm.generate`
                    reusing those layers (what FastV/DART cost), K = `--layer` or the default 2
  none-loop         control, only with in-LLM methods: keep-all through inllm's own layer loop,
                    to separate its overhead from transformers' `generate`
Columns: encode; select (the pruner, or for fastv/dart layers 0..K-1 on the full prompt + the
ranking); prefill (to the first token: for fastv/dart only layers K.. on the kept tokens);
decode (the other new tokens); LLM tokens = prompt length the last layers see.

Per cell: `--warmup` untimed runs, then mean +- std over `--repeats` runs; the ratio is to "none"
in the same run. Peak memory: on CUDA, `torch.cuda.max_memory_allocated` above the allocation
before the run (stats reset per run). On the CPU, the peak resident set size above the RSS before
the run: the kernel's high-water mark VmHWM is reset per run (writing 5 to /proc/self/clear_refs)
and read back from /proc/self/status; glibc is told to return large blocks to the OS
(mallopt M_MMAP_THRESHOLD fixed at 128 KiB, malloc_trim before each run) so that freed tensors
leave the RSS and each run's peak is its own. Without /proc (not Linux) memory is not reported.

`--model random` builds the random-weight LLaVA-1.5-shaped model of `bench prefill` (CLIP
ViT-L/14-336 + a `--llm-layers` Llama of width 4096): timings are real, answers meaningless.
"""
from __future__ import annotations

import ctypes
import statistics
import time

import torch

import mipruner
from mipruner import inllm
from mipruner.pruners import get_pruner
from mipruner.pruners.signals import encode_kwargs

from .cli import add_run_options, command_parser, names, parse, write_json
from .prefill import test_image
from .timing import table

PROMPT = "what is in the image? describe the red square."


# ---------------------------------------------------------------------------------------------- memory
class PeakMemory:
    """Peak memory of one call above the memory in use before it (bytes), CUDA or CPU RSS."""

    def __init__(self, device: torch.device):
        self.device = device
        self.libc = None
        self.cpu_ok = False
        if device.type != "cuda":
            try:
                self.libc = ctypes.CDLL("libc.so.6")
                self.libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, big blocks are mmapped
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self.cpu_ok = "VmHWM" in open("/proc/self/status").read()
            except (OSError, AttributeError):
                self.cpu_ok = False

    @staticmethod
    def _status_kb(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        elif self.cpu_ok:
            self.libc.malloc_trim(0)
            self.base = self._status_kb("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := current RSS

    def stop(self) -> float:
        """Peak above the start, in bytes (nan when not measurable)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return float(torch.cuda.max_memory_allocated(self.device) - self.base)
        if self.cpu_ok:
            return float(self._status_kb("VmHWM") - self.base) * 1024
        return float("nan")

    @property
    def kind(self) -> str:
        if self.device.type == "cuda":
            return "CUDA max_memory_allocated above the pre-run allocation"
        return "peak RSS (VmHWM) above the pre-run RSS" if self.cpu_ok else "not measured"


# ---------------------------------------------------------------------------------------------- runs
def make_run(adapter, image, method: str, budget, new_tokens: int, params: dict):
    """A function doing one end-to-end run of `method` at `budget`; returns (Answer, times dict)."""
    force = adapter.fixed_length_kwargs(new_tokens)
    signals = mipruner.signals_for([] if method in ("none", "none-loop") else [method])  # what it reads, one pass

    def run():
        t0 = time.perf_counter()
        enc = adapter.encode(image, PROMPT, **encode_kwargs(signals))
        t1 = time.perf_counter()
        if method == "none":
            ans = adapter.generate(enc, None, max_new_tokens=new_tokens, **force)
        elif method == "none-loop":
            ans = inllm.generate(adapter, enc, None, layer=params.get("layer", 2), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens)
        else:
            cache: dict = {}
            sel = mipruner.select(adapter, enc, method, budget, cache=cache, strict=False, **params)
            t2 = time.perf_counter()
            in_llm = get_pruner(method).stage == "llm"
            ans = mipruner.answer(adapter, enc, sel, max_new_tokens=new_tokens, cache=cache,
                                  **({"min_new_tokens": new_tokens} if in_llm else force))
        t3 = time.perf_counter()
        select_s = (t2 - t1) if method not in ("none", "none-loop") else 0.0
        return ans, {"encode_s": t1 - t0, "select_s": select_s, "prefill_s": ans.prefill_s,
                     "decode_s": ans.decode_s, "total_s": t3 - t0}

    return run


def measure_cell(run, repeats: int, warmup: int, mem: PeakMemory, sync) -> dict:
    for _ in range(warmup):
        run()
    totals, peaks, parts, answers = [], [], [], []
    for _ in range(repeats):
        mem.start()
        sync()
        ans, t = run()
        sync()
        peaks.append(mem.stop())
        totals.append(t["total_s"])
        parts.append(t)
        answers.append(ans)
    mean = lambda xs: statistics.fmean(xs)  # noqa: E731
    return {"total_ms": mean(totals) * 1e3, "std_ms": (statistics.stdev(totals) if len(totals) > 1 else 0.0) * 1e3,
            "median_ms": statistics.median(totals) * 1e3,
            **{k.replace("_s", "_ms"): mean([p[k] for p in parts]) * 1e3
               for k in ("encode_s", "select_s", "prefill_s", "decode_s")},
            "peak_mb": mean(peaks) / 2 ** 20, "peak_max_mb": max(peaks) / 2 ** 20,
            "llm_tokens": answers[-1].input_tokens, "visual_tokens": answers[-1].visual_tokens,
            "new_tokens": len(answers[-1].token_ids), "repeats": repeats}


def run_all(adapter, methods: list[str], budgets: list, repeats: int, warmup: int, new_tokens: int,
            params: dict, log=print) -> list[dict]:
    image = test_image(int(getattr(adapter.config.vision_config, "image_size", 336)))
    device = next(adapter.model.parameters()).device
    mem = PeakMemory(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    cells = [("none", "all")]
    if any(m != "none" and get_pruner(m).stage == "llm" for m in methods):
        cells.append(("none-loop", "all"))
    cells += [(m, b) for m in methods if m != "none" for b in budgets]
    rows = []
    with torch.inference_mode():
        for m, b in cells:
            r = measure_cell(make_run(adapter, image, m, b, new_tokens, params), repeats, warmup, mem, sync)
            if r["new_tokens"] != new_tokens:
                raise RuntimeError(f"{m} decoded {r['new_tokens']} tokens, not {new_tokens}")
            r.update(method=m, budget=b)
            rows.append(r)
            log(f"  {m:>10} {str(b):>5}: {r['total_ms']:.0f} +- {r['std_ms']:.0f} ms, peak {r['peak_mb']:.1f} MB")
    base = rows[0]
    for r in rows:
        r["ratio"] = r["total_ms"] / base["total_ms"]
        r["peak_ratio"] = r["peak_mb"] / base["peak_mb"] if base["peak_mb"] else float("nan")
    return rows


def format_rows(rows: list[dict]) -> str:
    body = [[r["method"], str(r["budget"]), str(r["llm_tokens"]), f"{r['total_ms']:.0f} ± {r['std_ms']:.0f}",
             f"{r['ratio']:.2f}", f"{r['encode_ms']:.0f}", f"{r['select_ms']:.1f}", f"{r['prefill_ms']:.0f}",
             f"{r['decode_ms']:.0f}", f"{r['peak_mb']:.1f}", f"{r['peak_ratio']:.2f}"] for r in rows]
    return table(body, ["method", "budget", "LLM tokens", "total ms", "vs none", "encode", "select",
                        "prefill", "decode", "peak MB", "vs none"])


def parse_budgets(text: str) -> list:
    return [float(b) if "." in b else int(b) for b in (x.strip() for x in text.split(",")) if b]


def main(argv=None) -> None:
    p = command_parser("efficiency", __doc__)
    p.add_argument("--model", default="random", help="'random' (built in memory), a path, hub id or alias")
    p.add_argument("--methods", default="none,mi,random,fastv,dart")
    p.add_argument("--budgets", default="64,128", help="ints are tokens, floats in (0,1] shares")
    add_run_options(p, repeats=30, warmup=10, device=None, dtype="bf16", json_help="write the rows to this JSON file")
    p.add_argument("--new-tokens", type=int, default=32, help="answer length, forced (EOS masked)")
    p.add_argument("--layer", type=int, default=None, help="fastv/dart K (default 2)")
    p.add_argument("--llm-layers", type=int, default=4, help="random model only")
    a = parse(p, argv)
    methods = names(a.methods)
    for m in methods:
        if m != "none":
            get_pruner(m)  # unknown names fail before the model is built
    dtype, device = a.torch_dtype, a.device
    t0 = time.perf_counter()
    if a.model == "random":
        from mipruner.models.llava.llava_hf import LlavaAdapter

        from mipruner.models.llava.random_weights import build_random_llava

        ad, desc = build_random_llava(llm_layers=a.llm_layers, dtype=dtype)
        if device.type != "cpu":
            ad = LlavaAdapter(ad.model.to(device), ad.processor, ad.tokenizer, ad.image_processor, name=ad.name)
    else:
        ad, desc = mipruner.load(a.model, device=device, dtype=dtype), a.model
    params = {} if a.layer is None else {"layer": a.layer}
    print(f"model: {desc}  (built/loaded in {time.perf_counter() - t0:.0f} s); device {device}, "
          f"torch threads {torch.get_num_threads()}; {a.warmup} warm-up + {a.repeats} timed runs per cell, "
          f"{a.new_tokens} new tokens")
    rows = run_all(ad, methods, parse_budgets(a.budgets), a.repeats, a.warmup, a.new_tokens, params)
    print(f"memory: {PeakMemory(device).kind}")
    print(format_rows(rows))
    write_json(a.json, {"model": desc, "device": str(device), "threads": torch.get_num_threads(),
                        "new_tokens": a.new_tokens, "rows": rows})
