"""Pruners: pure functions on tensors behind the method registry. No model, no I/O.

Each method is one decorated function in its own module; importing this package registers the
pre-LLM ones (the in-LLM methods of `mipruner.inllm` register into the same registry).
"""
from ._registry import (METHODS, MethodSpec, Param, PrunerSpec, all_params, did_you_mean, get_pruner, list_pruners,
                        prune, register_pruner, unregister_pruner)
from .selection import Selection, check_budget, resolve_budget

# Importing a method module registers it (one line per method module).
from . import mi  # noqa: E402,F401
from . import rand  # noqa: E402,F401
from . import similarity  # noqa: E402,F401
from . import divprune  # noqa: E402,F401
from . import cdpruner  # noqa: E402,F401
from . import attention  # noqa: E402,F401
from . import visionzip  # noqa: E402,F401
from . import vispruner  # noqa: E402,F401
from . import mi_attention  # noqa: E402,F401
from . import mi_adaptive  # noqa: E402,F401
from . import pool  # noqa: E402,F401
from . import evs  # noqa: E402,F401
from . import vidcom2  # noqa: E402,F401
from . import fastvid  # noqa: E402,F401
from . import tome  # noqa: E402,F401
from . import prunevid  # noqa: E402,F401
from . import holitom  # noqa: E402,F401
from .batched import prune_batch  # noqa: E402
from .capture import Capturable  # noqa: E402

__all__ = ["Capturable", "METHODS", "MethodSpec", "Param", "PrunerSpec", "Selection", "all_params", "check_budget",
           "did_you_mean", "get_pruner", "list_pruners", "prune", "prune_batch",
           "register_pruner", "resolve_budget", "unregister_pruner"]
