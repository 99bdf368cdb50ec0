"""The one change to vLLM's runtime: turn on the runner's M-RoPE recompute for this plug-in's Qwen models.

vLLM 0.32's V1 runner rewrites M-RoPE positions after pruning (`recompute_mrope_positions`) only
when its `is_multimodal_pruning_enabled` is set, and `GPUModelRunner.load_model` sets it only when
`video_pruning_rate > 0`; `CPUModelRunner.load_model` never sets it (so vLLM's own EVS fails on the
CPU). The wrapper below runs the original `load_model` and then sets the flag when the loaded model
declares `mipruner_mrope_recompute`; every other model is left as it was. The V2 runner (the GPU
default when Triton is present) builds its pruner elsewhere: serve Qwen with
VLLM_USE_V2_MODEL_RUNNER=0 (docs/vllm.md).
"""
from __future__ import annotations

import functools


def _wrap(cls) -> None:
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, "_mipruner", False):
        return

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if getattr(self.get_model(), "mipruner_mrope_recompute", False) and getattr(self, "uses_mrope", False):
            self.is_multimodal_pruning_enabled = True
        return result

    load_model._mipruner = True
    cls.load_model = load_model


def enable_position_recompute() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _wrap(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a build without the CPU runner
        return
    _wrap(CPUModelRunner)
