"""The model a Hugging Face Space starts on when its owner names none, chosen by the Space's hardware.

This is the one place the choice is declared (`HOSTED_DEFAULT`). app.py reads it for `--model`'s default:
MIPRUNER_MODEL (or --model) wins; on a Space without it, `HOSTED_DEFAULT[hardware()]`; locally the
embedded model `shapes-llava`. A default that cannot be loaded (no hub, no memory) leaves the embedded
model serving, and the status line says which model was tried and why, in one sentence
(`components.hosting.hub.ModelHub.load_default`).

How the hardware is told (read once, at start-up):
  SPACE_ID                    set by Spaces on every Space (huggingface.co/docs/hub/spaces-overview, "Helper
                              environment variables"); unset: not a Space.
  SPACES_ZERO_GPU == "true"   ZeroGPU hardware: what `spaces.config.Config.zero_gpu` and
                              `gradio.utils.is_zero_gpu_space` read. A GPU is lent per decorated call.
  torch.cuda.is_available()   a dedicated GPU (T4, L4, A10G, A100, H100 ...); False on CPU basic and CPU
                              upgrade. Asked only on a Space that is not ZeroGPU, after app.py's
                              `prepare()` (it does not initialise CUDA: it asks the driver).
"""
from __future__ import annotations

import os

EMBEDDED = "shapes-llava"

# hardware -> the hub id a Space starts on; each is one of components.hosting.hub.SUGGESTED (tests/app/test_space.py)
HOSTED_DEFAULT = {
    "zero-gpu": "Qwen/Qwen3-VL-2B-Instruct",  # 2.13 B parameters, the fewest tokens per picture of the 2-3 B models
    "gpu": "Qwen/Qwen3-VL-2B-Instruct",       # bf16 weights 4.3 GB: fits a 16 GB T4 with room for activations
    "cpu": "llava-hf/llava-onevision-qwen2-0.5b-ov-hf",  # 0.89 B; fewer vision-tower patches than InternVL3-1B
}

# The largest checkpoint (GB on the hub, mostly bf16) visitors may load on a Space of that hardware when the
# owner sets no MIPRUNER_MAX_MODEL_GB: on a CPU the app loads fp32, twice the checkpoint, and CPU basic has
# 16 GB (the 0.5-2 B models fit; a 7 B model would exhaust it). None: the app's own default (30).
HOSTED_MAX_MODEL_GB = {"cpu": 5.0, "zero-gpu": None, "gpu": None}

# What the page says under the model when answers do not follow every change (app.build_demo's auto_answers
# is off for a real model): why the visitor presses Generate answers. Figures: docs/space.md.
HARDWARE_NOTE = {
    "cpu": ("This Space runs on a CPU: encoding a photo and each answer of a real model take minutes here, so "
            "answers are not automatic; press Generate answers."),
    "zero-gpu": ("This Space borrows a GPU for each call (ZeroGPU) and every call counts against your daily GPU "
                 "quota, so answers are not automatic; press Generate answers."),
    "gpu": "",
}
ROLE = {"zero-gpu": "this Space's default on ZeroGPU", "gpu": "this Space's default on a GPU",
        "cpu": "this Space's default on a CPU"}


def on_space(env=None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get("SPACE_ID"))


def hardware(env=None, cuda: bool | None = None) -> str:
    """"zero-gpu", "gpu" or "cpu" (see the module docstring); cuda: torch's answer, asked when None."""
    env = os.environ if env is None else env
    if str(env.get("SPACES_ZERO_GPU", "")).lower() in ("1", "t", "true"):
        return "zero-gpu"
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return "gpu" if cuda else "cpu"


def start_model(env=None, cuda: bool | None = None) -> tuple[str, str]:
    """(model, role) the app starts on: MIPRUNER_MODEL when set (role ""), on a Space its hardware's
    default (role: e.g. "this Space's default on a CPU"), else the embedded model (role "")."""
    env = os.environ if env is None else env
    if env.get("MIPRUNER_MODEL"):
        return env["MIPRUNER_MODEL"], ""
    if on_space(env):
        kind = hardware(env, cuda)
        return HOSTED_DEFAULT[kind], ROLE[kind]
    return EMBEDDED, ""


def max_model_gb(env=None, cuda: bool | None = None, default: float = 30.0) -> float:
    """The size cap visitors' models get: MIPRUNER_MAX_MODEL_GB when set, on a Space its hardware's
    (HOSTED_MAX_MODEL_GB), else `default`."""
    env = os.environ if env is None else env
    if env.get("MIPRUNER_MAX_MODEL_GB"):
        return float(env["MIPRUNER_MAX_MODEL_GB"])
    if on_space(env):
        cap = HOSTED_MAX_MODEL_GB[hardware(env, cuda)]
        return default if cap is None else cap
    return default


__all__ = ["EMBEDDED", "HARDWARE_NOTE", "HOSTED_DEFAULT", "HOSTED_MAX_MODEL_GB", "ROLE", "hardware", "max_model_gb",
           "on_space", "start_model"]
