"""The method registry and the plug-in loader's state, restored after a test that loads plug-ins."""
from __future__ import annotations

import contextlib
import sys

import mipruner
from mipruner import plugins as P
from mipruner.pruners import _registry


@contextlib.contextmanager
def registry_restored(folder):
    """Within: load plug-ins into the process's registry. After: the registry and the loader are as before,
    and the modules of plug-in files under `folder` are forgotten (only those: the model code a test imports
    stays, as the rest of the process expects)."""
    mipruner.list_pruners()  # discovery has run: the built-ins (and any installed plug-in) are in
    saved = (_registry.METHODS.snapshot(), dict(P._LOADED), list(P._QUICK_CHECK))
    try:
        yield
    finally:
        _registry.METHODS.restore(saved[0])
        P._QUICK_CHECK[:] = saved[2]
        P._LOADED.clear()
        P._LOADED.update(saved[1])
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
                del sys.modules[name]
