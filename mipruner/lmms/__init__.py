"""Evaluate any pruner with lmms-eval (EvolvingLMMs-Lab/lmms-eval): the model `mipruner` and our tasks.

    python -m mipruner.lmms --model mipruner \
        --model_args pretrained=llava-hf/llava-1.5-7b-hf,method=mi,budget=64,lam=1 \
        --tasks mipruner_pope --batch_size 1 --log_samples --output_path results/
    accelerate launch --multi_gpu --num_processes 8 -m mipruner.lmms ...   # the same on 8 GPUs

`python -m mipruner.lmms` registers the model with lmms-eval, adds our task folder
(`mipruner/lmms/tasks`: POPE with accuracy, F1 and predicted yes-rate) to `--include_path`, and
runs lmms-eval's own command line with every argument given. `python -m mipruner.lmms.make_tasks
--out DIR` writes the synthetic shapes tasks of the embedded model (local data files) for
`--include_path DIR`. Importing this package does not import lmms-eval; `register()` does.
"""
from __future__ import annotations

import os

MODEL_ID = "mipruner"
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")


def manifest():
    """The lmms-eval `ModelManifest` of the model (also usable as an entry point of group `lmms_eval.models`)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path="mipruner.lmms.model.MiPruner")


def register() -> None:
    """Make `--model mipruner` known to lmms-eval in this process (its CLI finds models only there)."""
    from lmms_eval.models import MODEL_REGISTRY_V2

    MODEL_REGISTRY_V2.register_manifest(manifest(), overwrite=True)


__all__ = ["MODEL_ID", "TASKS_DIR", "manifest", "register"]
