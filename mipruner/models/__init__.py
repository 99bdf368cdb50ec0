"""Model adapters, one folder per family, imported lazily from the family table (`families.FAMILIES`).

`load(name_or_path)` reads the model's config, picks the family from `model_type`, and returns
that family's adapter. Importing this package does not import transformers.
"""
from __future__ import annotations

from ..registry import Registry
from .base import Adapter, Answer, Encoded, TokenGeometry, keep_indices
from .families import FAMILIES, Family
from .common.shipped import shipped

# The family table as one registry object (`mipruner.registry.Registry`, as the methods'): config
# model_type -> adapter class, a lazy entry per family (its folder's "module:Class"), imported on first use.
ADAPTERS = Registry("model type")
for _family in FAMILIES.values():
    ADAPTERS.register_lazy(_family.name, _family.adapter_target)

# Short names that resolve to models shipped under assets/ (inside the installed package: shipped.py).
ALIASES: dict[str, str] = {"shapes-llava": shipped("shapes-llava")}


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


__all__ = ["ADAPTERS", "ALIASES", "Adapter", "Answer", "Encoded", "FAMILIES", "Family", "TokenGeometry",
           "adapter_class", "keep_indices", "load", "resolve"]
