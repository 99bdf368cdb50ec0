"""The one table of selection methods: name -> `MethodSpec` (a `mipruner.registry.Registry`).

Filled by `register_pruner` (`_registry.py`) and the plug-in loader; read by name wherever a method's
declared properties are needed (`capture.capturable`), without importing the registration code.
`mipruner.plugins` adds its lazy discovery of installed plug-ins as a first-use hook, so they register
after the built-ins and only when needed.
"""
from __future__ import annotations

from ..registry import Registry

METHODS = Registry("pruner")

__all__ = ["METHODS"]
