"""mipruner's visual-token pruning inside vLLM, per request (docs/vllm.md).

Installed, this package's `vllm.general_plugins` entry point calls `register()` in every vLLM
process: it registers the architectures below. A deployment picks one with
`hf_overrides={"architectures": [name]}` (server: `--hf-overrides`); a request picks the method and
budget in `mm_processor_kwargs` (`request.py`). Nothing is pruned unless a request asks.
"""
from __future__ import annotations

import logging

VLLM_VERSION = "0.32.0"  # the plug-in subclasses vLLM's private processor and model methods: exactly this
ARCHITECTURES = {
    "MiPrunerLlavaForConditionalGeneration": "mipruner_vllm.llava:MiPrunerLlavaForConditionalGeneration",
    "MiPrunerQwen2VLForConditionalGeneration": "mipruner_vllm.qwen2_vl:MiPrunerQwen2VLForConditionalGeneration",
    "MiPrunerQwen2_5_VLForConditionalGeneration": "mipruner_vllm.qwen:MiPrunerQwen2_5_VLForConditionalGeneration",
    "MiPrunerLlavaNextForConditionalGeneration": "mipruner_vllm.llava_next:MiPrunerLlavaNextForConditionalGeneration",
    "MiPrunerLlavaOnevisionForConditionalGeneration":
        "mipruner_vllm.llava_onevision:MiPrunerLlavaOnevisionForConditionalGeneration",
    "MiPrunerQwen3VLForConditionalGeneration": "mipruner_vllm.qwen3_vl:MiPrunerQwen3VLForConditionalGeneration",
}
# The stock architecture each one extends (the checkpoint's `architectures`).
BASES = {"MiPrunerLlavaForConditionalGeneration": "LlavaForConditionalGeneration",
         "MiPrunerQwen2VLForConditionalGeneration": "Qwen2VLForConditionalGeneration",
         "MiPrunerQwen2_5_VLForConditionalGeneration": "Qwen2_5_VLForConditionalGeneration",
         "MiPrunerLlavaNextForConditionalGeneration": "LlavaNextForConditionalGeneration",
         "MiPrunerLlavaOnevisionForConditionalGeneration": "LlavaOnevisionForConditionalGeneration",
         "MiPrunerQwen3VLForConditionalGeneration": "Qwen3VLForConditionalGeneration"}
log = logging.getLogger(__name__)


def installed_vllm() -> str:
    from vllm import _version

    return str(_version.__version__)


def version_problem() -> str | None:
    """None when the installed vLLM is the pinned one, else the sentence saying it is not."""
    have = installed_vllm()
    if have.split("+")[0] != VLLM_VERSION:
        return (f"mipruner-vllm is built against vLLM {VLLM_VERSION} exactly (it subclasses private methods that "
                f"change between releases), but vLLM {have} is installed: pip install vllm=={VLLM_VERSION}")
    return None


def register() -> None:
    """vLLM's plug-in hook: register the pruning architectures (nothing, with an error logged, on another vLLM)."""
    problem = version_problem()
    if problem:
        log.error(problem)
        return
    from vllm import ModelRegistry

    from .runner import enable_position_recompute

    for name, where in ARCHITECTURES.items():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, where)
    enable_position_recompute()
