"""Fixtures of the vLLM anchor tests: tiny checkpoints, one in-process vLLM engine per family.

Run in the vLLM venv (`bash .ci/vllm`), never by the main suite. Every engine is in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"), float32, eager, a 1 GiB KV cache.
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["MIPRUNER_VLLM_RECORD"] = "1"  # the worker keeps its last selections (select.RECORD)
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

from mipruner_vllm import tiny as tiny_models  # noqa: E402

FAMILIES = {  # family -> (builder, our architecture)
    "llava": (tiny_models.build_llava, "MiPrunerLlavaForConditionalGeneration"),
    "qwen2_5_vl": (tiny_models.build_qwen2_5_vl, "MiPrunerQwen2_5_VLForConditionalGeneration"),
    "qwen2_vl": (tiny_models.build_qwen2_vl, "MiPrunerQwen2VLForConditionalGeneration"),
    "llava_next": (tiny_models.build_llava_next, "MiPrunerLlavaNextForConditionalGeneration"),
    "llava_onevision": (tiny_models.build_llava_onevision, "MiPrunerLlavaOnevisionForConditionalGeneration"),
    "qwen3_vl": (tiny_models.build_qwen3_vl, "MiPrunerQwen3VLForConditionalGeneration"),
}
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=512, distributed_executor_backend="uni", seed=0)
LIMITS = {"llava": {"image": 2, "video": 0}, "qwen2_5_vl": {"image": 2, "video": 1},  # media per prompt
          "qwen2_vl": {"image": 2, "video": 1}, "llava_next": {"image": 2, "video": 0},
          "llava_onevision": {"image": 2, "video": 1},
          "qwen3_vl": {"image": 2}}  # Qwen3-VL: images only in the plug-in (its videos: docs/vllm.md)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """family -> (checkpoint folder, mipruner adapter on the same weights); built once."""
    return {fam: build(tmp_path_factory.mktemp(fam)) for fam, (build, _) in FAMILIES.items()}


@pytest.fixture(scope="module", params=list(FAMILIES))
def engine(request, models):
    """(family, vllm.LLM with the plug-in's architecture, adapter, checkpoint folder)."""
    from vllm import LLM

    fam = request.param
    path, adapter = models[fam]
    llm = LLM(model=str(path), hf_overrides={"architectures": [FAMILIES[fam][1]]}, limit_mm_per_prompt=LIMITS[fam],
              **ENGINE)
    yield fam, llm, adapter, path
    del llm
    gc.collect()
