"""Model adapters, one file per family, imported lazily from a name -> "module:Class" table.

`load(name_or_path)` reads the model's config, picks the family from `model_type`, and returns
that family's adapter. Importing this package does not import transformers.
"""
from __future__ import annotations

import os

from ..registry import Registry
from .base import Adapter, Answer, Encoded, TokenGeometry, keep_indices

# config.model_type -> "module:Class" (relative to this package)
FAMILIES: dict[str, str] = {
    "llava": "llava_hf:LlavaAdapter",
    "llava_next": "llava_next:LlavaNextAdapter",
    "video_llava": "video_llava:VideoLlavaAdapter",
    "llava_onevision": "llava_onevision:LlavaOnevisionAdapter",
    "internvl": "internvl:InternVLAdapter",
    "qwen2_vl": "qwen2_vl:Qwen2VLAdapter",
    "qwen2_5_vl": "qwen2_vl:Qwen2VLAdapter",
    "qwen3_vl": "qwen3_vl:Qwen3VLAdapter",
}

# The same table as one registry object (`mipruner.registry.Registry`, as the methods'): lazy entries,
# imported on first use.
ADAPTERS = Registry("model type")
for _type, _target in FAMILIES.items():
    ADAPTERS.register_lazy(_type, f"{__name__}.{_target}")

_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")
# Short names that resolve to models shipped under assets/.
ALIASES: dict[str, str] = {"shapes-llava": os.path.join(_ASSETS, "shapes-llava")}


def adapter_class(model_type: str) -> type[Adapter]:
    """The adapter class for a config `model_type`; unsupported types raise with the list."""
    return ADAPTERS.get(model_type)


def resolve(name_or_path: str) -> str:
    """An alias ("shapes-llava") -> its shipped directory; anything else unchanged."""
    return ALIASES.get(name_or_path, name_or_path)


def load(name_or_path: str, device=None, dtype=None, **kwargs) -> Adapter:
    """Load a model by hub id, local directory or alias and return its adapter."""
    from transformers import AutoConfig

    path = resolve(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a model config from {name_or_path!r}: {e}") from None
    cls = adapter_class(getattr(config, "model_type", ""))
    return cls.from_pretrained(path, device=device, dtype=dtype, **kwargs)


__all__ = ["ADAPTERS", "ALIASES", "Adapter", "Answer", "Encoded", "FAMILIES", "TokenGeometry", "adapter_class",
           "keep_indices", "load", "resolve"]
