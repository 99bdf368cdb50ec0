"""What a session holds, in bytes (`nbytes`), and handing freed bytes back to the operating system (`Release`).

`mipruner.serve.session.CacheBudget` charges every cached encoding by `nbytes` of everything it holds and calls its
`Release` after entries were dropped; the model's own tensors (`model_storages`) are shared, never a session's.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections import deque
from dataclasses import fields, is_dataclass
from typing import Any, Callable

import numpy as np
from PIL import Image


class Release:
    """Hands memory freed by dropped entries back to the operating system, at most once per `every_s` seconds.

    CPython frees an entry's tensors, arrays and images at once, but glibc's malloc keeps the pages in the
    arena of the thread that freed them (a server runs its handlers on many threads, one arena each), so the
    process' RSS only ever grows to the sum of every arena's high-water mark. `__call__` collects reference
    cycles (an entry's lazy geometry closes over its encoding) and calls glibc's `malloc_trim(0)`, which
    returns every arena's free pages; elsewhere (no glibc) it only collects. `count` says how often it ran."""

    def __init__(self, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic, defer: bool = True):
        self.every_s, self.clock, self.defer = float(every_s), clock, defer
        self._last = -float("inf")
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.count = 0
        self._trim = _malloc_trim()

    def __call__(self, force: bool = False) -> bool:
        """Release now unless it ran less than `every_s` ago (force: always); whether it ran. A release put off
        runs by itself once the interval is over (`defer`: a daemon timer), so a server that goes quiet right
        after dropping entries still hands their bytes back."""
        with self._lock:
            now = self.clock()
            if not force and now - self._last < self.every_s:
                if self.defer and self._timer is None:
                    self._timer = threading.Timer(self.every_s - (now - self._last), self._deferred)
                    self._timer.daemon = True
                    self._timer.start()
                return False
            self._last = now
            self.count += 1
        gc.collect()
        if self._trim is not None:
            self._trim(0)
        return True

    def _deferred(self) -> None:
        with self._lock:
            self._timer = None
        self(force=True)


def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, "malloc_trim", None)
    except OSError:
        return None


def model_storages(adapter) -> frozenset:
    """The storages of the adapter's modules' parameters and buffers: shared by every session, so `nbytes`
    never charges them to one (an encoding may hold views of them)."""
    import itertools

    import torch

    mods = [m for m in vars(adapter).values() if isinstance(m, torch.nn.Module)]
    return frozenset(t.untyped_storage().data_ptr() for m in mods for t in itertools.chain(m.parameters(), m.buffers()))


_BYTES_PER_BAND = {"I": 4, "F": 4, "I;16": 2, "I;16B": 2, "I;16L": 2}


def nbytes(obj: Any, skip: frozenset = frozenset(), shared: tuple = ()) -> int:
    """Bytes reachable from `obj`: its tensors' storages (each counted once; storages whose data_ptr is in `skip`,
    the model's weights, are not), arrays and images by their pixels, and every Python object on the way (strings,
    containers, plain objects, dataclasses, slots, closures' cells: an unbuilt LazyGeometry holds its inputs in
    its build function) by `sys.getsizeof`. `torch.nn.Module`s, classes, modules and the objects in `shared`
    (the adapter: one per app) are not entered, however deep the rest is nested."""
    import functools
    import sys
    import types

    import torch

    seen = {id(o) for o in shared}
    storages, total = set(), 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if x is None or isinstance(x, (bool, int, float, complex)) or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, (str, bytes, bytearray)):
            total += sys.getsizeof(x)
        elif isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            ptr = (str(x.device), st.data_ptr())
            if st.data_ptr() not in skip and ptr not in storages:
                storages.add(ptr)
                total += st.nbytes()
        elif isinstance(x, np.ndarray):
            total += x.nbytes
        elif isinstance(x, Image.Image):
            total += x.width * x.height * len(x.getbands()) * _BYTES_PER_BAND.get(x.mode, 1)
        elif isinstance(x, (torch.nn.Module, type, types.ModuleType, types.BuiltinFunctionType, threading.Thread)):
            continue
        else:
            total += sys.getsizeof(x)
            if isinstance(x, dict):
                stack += x.keys()
                stack += x.values()
            elif isinstance(x, (list, tuple, set, frozenset, deque)):
                stack += x
            elif isinstance(x, types.FunctionType):
                stack += [c.cell_contents for c in (x.__closure__ or ()) if _filled(c)]
            elif isinstance(x, types.MethodType):
                stack += [x.__func__, x.__self__]
            elif isinstance(x, functools.partial):
                stack += [x.func, *x.args, *x.keywords.values()]
            else:
                d = getattr(x, "__dict__", None)
                if d is not None:
                    stack += d.values()
                elif is_dataclass(x):
                    stack += [getattr(x, f.name, None) for f in fields(x)]
                for name in getattr(type(x), "__slots__", ()):
                    stack.append(getattr(x, name, None))
    return total


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True




__all__ = ["Release", "model_storages", "nbytes"]
