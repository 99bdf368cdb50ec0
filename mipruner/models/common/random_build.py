"""Random-weight models built as checkpoints load: in the target dtype, rotary frequencies in float32.

`build_model(make, config, device=, dtype=)` constructs `make(config)` (a model class, or e.g.
`AutoModelForImageTextToText.from_config`) under `torch.device(device)` with torch's default dtype
set to `dtype`, as transformers' `from_pretrained(..., dtype=)` does. Each parameter is drawn
directly in `dtype` on `device`: no float32 model first and a cast after, which at a 7B-8B shape
held 28-32 GB of float32 for a moment. Rotary `inv_freq` buffers (and `original_inv_freq`) stay
in float32. transformers computes them in float32 explicitly, and real checkpoints keep them so;
the old build-then-`.to(dtype)` cast them to bf16, which rounds the rotary angles of long prompts.
The model is returned in eval mode.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

ROTARY = ("inv_freq", "original_inv_freq")


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default floating dtype set to `dtype` inside the block, restored after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def rotary_in_float32(model: torch.nn.Module) -> int:
    """Every rotary `inv_freq` / `original_inv_freq` tensor of `model` in float32 (cast where one is
    not; a buffer stays a buffer); returns how many there are."""
    n = 0
    for module in model.modules():
        for name in ROTARY:
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                n += 1
                if t.dtype != torch.float32:
                    setattr(module, name, t.float())
    return n


def build_model(make: Callable, config, *, device, dtype: torch.dtype) -> torch.nn.Module:
    """`make(config)` built on `device` with its parameters in `dtype` and its rotary frequencies
    in float32, in eval mode."""
    with torch.device(device), default_dtype(dtype):
        model = make(config)
    rotary_in_float32(model)
    return model.eval()
