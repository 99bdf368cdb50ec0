"""How an adapter decodes: the plain path (default) or the GPU path (bucketed lengths, static KV
cache, optionally `torch.compile`), and what the batched decoders share.

`DecodePath()` is the plain path: `adapter.generate` is exactly what it was (one prompt, dynamic
KV cache, nothing padded). Any other `DecodePath` sends every answer, batched or not, through
the family's batched decoder (`common/embeds_rows.py`, `qwen/batch.py`) with:

  bucket        the rows' groups left-padded up to a multiple of `bucket` (masked pad columns), and
                the static cache sized to a multiple of it, so that kept-token counts fall into a
                fixed set of shapes instead of one shape each (a compiled or captured graph is
                specialised to its shapes: without buckets every budget would recompile); the
                static cache holds the batch's PRUNED width (bucketed) + new tokens;
  static_cache  a preallocated `StaticCache` the engine's greedy loop decodes in (`common/decode.py`;
                where the LLaVA family falls back to `generate`: `cache_implementation="static"`);
  compile       the prefill (rows padded to a power of two, width to the bucket) and the decoding
                step through `torch.compile` (`common/greedy.compiled`: CUDA graphs on CUDA), every
                family alike; `mipruner.serve.warm_up` compiles the fixed set at start. Off by default:
                compiling takes tens of seconds per new shape.

Padding never changes what a row computes beyond float rounding: its pad columns are masked out of
attention and its positions are passed explicitly, so the keep-all row gives the unpruned answer
(tests/models/test_batch_*.py). Logits are not bit-identical to the plain path (a masked SDPA call
is a different kernel from an unmasked causal one), so equality of greedy tokens is the anchor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodePath:
    """bucket: pad prompt lengths up to a multiple of this (0: no padding beyond the batch's longest).
    static_cache: a preallocated static KV cache. compile: compile the decoding step (needs a
    static cache on the LLaVA family)."""

    bucket: int = 0
    static_cache: bool = False
    compile: bool = False

    def __post_init__(self):
        if int(self.bucket) < 0:
            raise ValueError(f"bucket must be >= 0, got {self.bucket}")

    @property
    def plain(self) -> bool:
        return not (self.bucket or self.static_cache or self.compile)


PLAIN = DecodePath()


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (unchanged when multiple <= 0)."""
    return n if multiple <= 0 else -(-int(n) // multiple) * multiple


def trim_at_eos(ids: list[int], eos: list[int]) -> list[int]:
    """`ids` up to and including the first EOS (what an unbatched run stops at)."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def left_pad(rows: list[torch.Tensor], width: int, fill) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (L_i, ...) -> (B, width, ...) right-aligned, the rest `fill`, and the (B, width) long
    mask of real columns. Tensors are made on the rows' device with their dtype."""
    first = rows[0]
    out = torch.full((len(rows), width, *first.shape[1:]), fill, dtype=first.dtype, device=first.device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=first.device)
    for i, r in enumerate(rows):
        n = int(r.shape[0])
        out[i, width - n:] = r
        mask[i, width - n:] = 1
    return out, mask


__all__ = ["DecodePath", "PLAIN", "left_pad", "round_up", "trim_at_eos"]


class PrefillTimer:
    """A LogitsProcessor that timestamps its first call: the end of the prefill forward."""

    def __init__(self):
        self.first: float | None = None

    def __call__(self, input_ids, scores):
        if self.first is None:
            if scores.is_cuda:
                torch.cuda.synchronize(scores.device)
            self.first = time.perf_counter()
        return scores


def cuda_sync(device: torch.device) -> None:
    """Wait for the queued CUDA work so a wall-clock mark covers it; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
