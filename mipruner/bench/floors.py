"""The physical floor of a cell: what the device's peak FLOP/s and memory bandwidth allow.

Device figures (`device_figures`): a small table of datasheet numbers (dense tensor-core FLOP/s, no
sparsity; HBM bandwidth), matched on `torch.cuda.get_device_name`, or given on the command line
(`--peak-tflops`, `--bandwidth-gbs`). On the CPU, or an unknown GPU, the floor is unknown unless given.
The source of the figures is printed with every report.

Floors (`cell_floor`), for a batch of `rows` identical rows of `prompt` LLM tokens (or rows of their own
lengths, `prompts`):
- time to first token: the vision tower on the row's images plus the LLM prefill, as a roofline:
  max(FLOPs / peak FLOP/s, bytes / bandwidth), the bytes being the weights read once (the tower's and
  the LLM's) and the KV cache written. The issue's wording (FLOPs / peak) is the first term; at 79
  tokens a 7B LLM is bound by reading its weights, so both terms are given and the floor is the larger;
- one decoding step: the LLM's weights plus the KV cache of every row (the context at the middle of
  the answer) read once, over the bandwidth (`decode_weight_ms`: the weights alone, the issue's
  "weight-bandwidth floor" of the per-token goal).
FLOPs per row: `mipruner.serve.answer_time.row_prefill_flops` (LLM) and `tower_flops` (a ViT's blocks and the
projector), both approximations from the configs (norms, softmax and rotary left out).

The floor of a ratio of two cells (`floor_ratio`) is the ratio of their floors: in ms where the device's
figures are known, else in FLOPs (the compute floor, known on any device). The reports print it beside
every ratio, so that "0.514x generate's" reads against "floor 0.506".
"""
from __future__ import annotations

from mipruner.serve.answer_time import row_prefill_flops
from mipruner.measure.compute import LLMShape

# (substrings of torch.cuda.get_device_name, all must match) -> figures; TFLOP/s dense, GB/s
DEVICES = [
    {"name": "H200", "match": ("H200",), "bf16": 989.4, "fp32": 67.0, "gbs": 4800.0,
     "source": "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOP/s with sparsity, 989 dense; "
               "HBM3e 4.8 TB/s"},
    {"name": "H100 NVL", "match": ("H100", "NVL"), "bf16": 835.0, "fp32": 60.0, "gbs": 3900.0,
     "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL): BF16 1,671 TFLOP/s with sparsity, 835 dense; "
               "3.9 TB/s"},
    {"name": "H100 PCIe", "match": ("H100", "PCIe"), "bf16": 756.5, "fp32": 51.0, "gbs": 2000.0,
     "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): BF16 1,513 TFLOP/s with sparsity, 756 dense; "
               "HBM2e 2.0 TB/s"},
    {"name": "H100 SXM", "match": ("H100",), "bf16": 989.4, "fp32": 67.0, "gbs": 3350.0,
     "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOP/s with sparsity, 989 dense; "
               "HBM3 3.35 TB/s"},
    {"name": "A100 80GB PCIe", "match": ("A100", "80GB", "PCIe"), "bf16": 312.0, "fp32": 19.5, "gbs": 1935.0,
     "source": "NVIDIA A100 Tensor Core GPU datasheet (80GB PCIe): BF16 312 TFLOP/s dense; HBM2e 1,935 GB/s"},
    {"name": "A100 80GB SXM", "match": ("A100", "80GB"), "bf16": 312.0, "fp32": 19.5, "gbs": 2039.0,
     "source": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOP/s dense; HBM2e 2,039 GB/s"},
    {"name": "A100 40GB", "match": ("A100",), "bf16": 312.0, "fp32": 19.5, "gbs": 1555.0,
     "source": "NVIDIA A100 Tensor Core GPU datasheet (40GB): BF16 312 TFLOP/s dense; HBM2 1,555 GB/s"},
]
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def device_name(device) -> str:
    """torch's CUDA device name ("NVIDIA H100 80GB HBM3"), or the device type ("cpu") elsewhere."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device.type)


def device_figures(name: str, dtype: str, peak_tflops: float | None = None,
                   bandwidth_gbs: float | None = None) -> dict:
    """{peak_flops, bandwidth (bytes/s), source} for a device name ('cpu' or torch's CUDA name) and
    dtype; None figures where unknown. Given figures replace the table's."""
    row = next((d for d in DEVICES if all(m.lower() in name.lower() for m in d["match"])), None)
    peak = bw = None
    source = "unknown: not in the table of known devices (give --peak-tflops and --bandwidth-gbs)"
    if name == "cpu":
        source = "unknown on the CPU unless given (--peak-tflops, --bandwidth-gbs)"
    if row is not None:
        peak = (row["fp32"] if dtype == "fp32" else row["bf16"]) * 1e12
        bw = row["gbs"] * 1e9
        source = f"{row['name']}: {row['source']}" + (" (fp32 without tensor cores)" if dtype == "fp32" else "")
    if peak_tflops or bandwidth_gbs:
        peak = peak_tflops * 1e12 if peak_tflops else peak
        bw = bandwidth_gbs * 1e9 if bandwidth_gbs else bw
        source = f"given on the command line ({peak_tflops} TFLOP/s, {bandwidth_gbs} GB/s)" + (
            f"; otherwise {source}" if row is not None else "")
    return {"device": name, "peak_flops": peak, "bandwidth": bw, "source": source}


def tower_flops(config, images: int = 1) -> float:
    """A ViT's blocks over its patches (+ [CLS]) and a two-layer projector, per `images` (from the
    vision config: image_size, patch_size, hidden_size, intermediate_size, num_hidden_layers)."""
    v = getattr(config, "vision_config", None)
    if v is None or not hasattr(v, "image_size"):
        return 0.0
    T = (int(v.image_size) // int(v.patch_size)) ** 2 + 1
    d, f, layers = int(v.hidden_size), int(v.intermediate_size), int(v.num_hidden_layers)
    blocks = layers * (2 * T * (4 * d * d + 2 * d * f) + 4 * T * T * d)
    D = LLMShape.of(config).hidden
    return float(images * (blocks + 2 * (T - 1) * (d * D + D * D)))


def weight_bytes(config, dtype: str) -> dict:
    """Bytes of the weights a forward reads: {'llm': decoder layers + output head, 'tower': ViT + projector}."""
    shape = LLMShape.of(config)
    llm = shape.layers * shape.layer_weights() + shape.hidden * shape.vocab
    v = getattr(config, "vision_config", None)
    tower = 0
    if v is not None and hasattr(v, "intermediate_size"):
        d, f = int(v.hidden_size), int(v.intermediate_size)
        tower = int(v.num_hidden_layers) * (4 * d * d + 2 * d * f) + d * shape.hidden + shape.hidden ** 2
    return {"llm": llm * BYTES[dtype], "tower": tower * BYTES[dtype]}


def kv_bytes(config, tokens: int, dtype: str) -> float:
    """The KV cache of `tokens` tokens: keys and values of every layer."""
    return float(LLMShape.of(config, value_bytes=BYTES[dtype]).kv_bytes([tokens] * LLMShape.of(config).layers))


def cell_floor(config, dev: dict, dtype: str, prompt: int, new_tokens: int, rows: int = 1,
               images: int = 1, prompts: list[int] | None = None) -> dict:
    """Floors in ms of one cell (module docstring); None where the device's figures are unknown.

    `prompts`: each row's LLM tokens where the rows differ (the app's view: the unpruned row and the pruned
    ones; `rows` is then their count), else `rows` rows of `prompt`. `images`: tower passes per row (0 when
    the cell reads a cached encoding). `total_flops` (the whole answer: the prefill and every decoding step,
    i.e. each row's prefill FLOPs at prompt + new - 1 tokens) and `prefill_flops` are known on any device:
    the compute floor of a ratio where the device's figures are not."""
    prompts = [int(prompt)] * rows if prompts is None else [int(p) for p in prompts]
    rows = len(prompts)
    w = weight_bytes(config, dtype)
    tower = rows * tower_flops(config, images) if images else 0.0
    flops = sum(row_prefill_flops(config, p) for p in prompts) + tower
    total_flops = sum(row_prefill_flops(config, p + max(int(new_tokens), 1) - 1) for p in prompts) + tower
    ttft_bytes = w["llm"] + (w["tower"] if images else 0) + sum(kv_bytes(config, p, dtype) for p in prompts)
    step_bytes = w["llm"] + sum(kv_bytes(config, p + new_tokens // 2, dtype) for p in prompts)
    peak, bw = dev["peak_flops"], dev["bandwidth"]
    ms = lambda x, rate: (x / rate * 1e3) if rate else None  # noqa: E731
    compute, memory = ms(flops, peak), ms(ttft_bytes, bw)
    ttft = max(compute, memory) if compute is not None and memory is not None else None
    step = ms(step_bytes, bw)
    return {"prefill_flops": flops, "total_flops": total_flops, "ttft_compute_ms": compute, "ttft_memory_ms": memory,
            "ttft_ms": ttft, "decode_step_ms": step, "decode_weight_ms": ms(w["llm"], bw),
            "total_ms": ttft + (max(int(new_tokens), 1) - 1) * step if ttft is not None and step is not None else None,
            "weights_gb": round((w["llm"] + w["tower"]) / 1e9, 3), "llm": type(getattr(config, "text_config", None) or config).__name__}


def floor_ratio(a: dict | None, b: dict | None, key: str = "ttft") -> tuple[float | None, str | None]:
    """The floor of the ratio a / b of two cells' floors (`cell_floor`), for `key` "ttft" or "total":
    (ratio, "ms") from the device's figures where both are known, else (ratio, "FLOPs") from the compute
    alone (prefill FLOPs for "ttft", the whole answer's for "total"); (None, None) when a floor is missing."""
    if not a or not b:
        return None, None
    ms_key, flops_key = f"{key}_ms", ("prefill_flops" if key == "ttft" else "total_flops")
    if a.get(ms_key) and b.get(ms_key):
        return round(a[ms_key] / b[ms_key], 3), "ms"
    if a.get(flops_key) and b.get(flops_key):
        return round(a[flops_key] / b[flops_key], 3), "FLOPs"
    return None, None
