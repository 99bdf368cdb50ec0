"""Which models the app can run, and one shared `ModelService` per loaded model.

The embedded model (`shapes-llava`, shipped under assets/) is loaded at start-up and never
unloaded: it is the fallback when another model cannot be loaded (offline, missing weights, out of
memory, unsupported type). At most `max_loaded` models are held at once; loading another drops the
least recently used one that is not the fallback. Engines hold no per-user state (see
`mipruner.serve.service`), so one engine per model serves every browser session; they share one byte cap
on cached encodings (`CacheBudget`).

What may be loaded is a `ModelPolicy` (components.hosting.policy): an allow-list of ids, a size cap read
from the hub's metadata before any download, and the local folders models may come from.
"""
from __future__ import annotations

import gc
import os
import socket
import threading
import urllib.parse
from collections import OrderedDict
from typing import Callable

from mipruner.serve.service import DEFAULT_CACHE_BYTES, ModelService, load_adapter
from mipruner.models.families import suggested_models
from mipruner.serve.session import CacheBudget

from ..core.messages import plain, short
from .policy import ModelPolicy, cached_locally, looks_local

EMBEDDED = "shapes-llava"

# Real checkpoints offered in the dropdown: each family's suggested ones, from the family table (any other
# hub id or local path can be typed in).
SUGGESTED = (EMBEDDED, *suggested_models())


OFFLINE = "its files are not on this machine and the model hub cannot be reached"


def hub_reachable(timeout: float = 3.0, endpoint: str | None = None) -> bool:
    """Whether the model hub (HF_ENDPOINT, else huggingface.co) takes a connection within `timeout` seconds:
    asked once at start-up, so an offline server falls back at once instead of after the hub client's retries.
    True behind a proxy (the proxy decides); False when HF_HUB_OFFLINE is set."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urllib.parse.urlsplit(endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return True
    except (OSError, ValueError):
        return False


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why in plain words (`why`: the reason alone)."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why


def load_error_reason(err: BaseException) -> str:
    """Why a load failed, in plain words (a clause, no full stop)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, MemoryError) or "out of memory" in str(err).lower():
        return "not enough memory to load it"
    if isinstance(err, (OSError, ValueError)) and any(s in str(err) for s in (
            "offline", "not a local folder", "cannot load a model config", "Connection", "resolve")):
        return "its files are not on this machine and the model hub cannot be reached"
    return plain(text)[:300].rstrip(". ")


def describe_load_error(name: str, err: BaseException) -> str:
    """A plain-language reason for a failed load."""
    return f"Could not load {short(name)} ({load_error_reason(err)})."


class ModelHub:
    """Engines by model name, loaded on demand; `get` falls back to the embedded model.

    loader(name, device, dtype) -> Adapter; defaults to `mipruner.load` (never with trust_remote_code).
    policy: what may be loaded (default: anything); cache_bytes: the cap on all sessions' encodings.
    """

    def __init__(self, default: str = EMBEDDED, *, device=None, dtype=None, max_loaded: int = 2,
                 loader: Callable | None = None, fallback: str = EMBEDDED, policy: ModelPolicy | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES):
        if max_loaded < 1:
            raise ValueError(f"max_loaded must be >= 1, got {max_loaded}")
        self.device, self.dtype, self.max_loaded = device, dtype, max_loaded
        self.fallback = fallback
        self._loader = loader
        self._engines: OrderedDict[str, ModelService] = OrderedDict()
        self._lock = threading.Lock()
        self.default = default
        self.startup_message = ""
        self.policy = policy or ModelPolicy()
        self.policy.trusted = tuple(dict.fromkeys((*self.policy.trusted, default, fallback)))
        self.cache = CacheBudget(cache_bytes)

    def load_default(self, role: str = "", reachable=None) -> str:
        """Load the start-up model (or the fallback when it fails); returns a status message. When it
        fails, one sentence names the model tried, its `role` when given (e.g. "this Space's default on
        a CPU") and why, and says that the fallback serves instead. reachable() -> False (e.g.
        `hub_reachable`): a hub model not in the local cache fails at once, without the hub's retries."""
        try:
            if (reachable is not None and self.default != self.fallback
                    and not looks_local(self.default) and not cached_locally(self.default) and not reachable()):
                raise ModelLoadError(f"Could not load {short(self.default)} ({OFFLINE}).", OFFLINE)
            self._load(self.default)
            self.startup_message = f"Model {self.default!r} loaded."
        except ModelLoadError as e:
            if self.default == self.fallback:
                raise
            self._load(self.fallback)
            tried = f"{self.default!r}, {role}," if role else repr(self.default)
            why = e.why or str(e)
            self.startup_message = (f"Could not load {tried} because {why}, so the embedded model {self.fallback!r} "
                                    "serves instead.")
            self.default = self.fallback
        return self.startup_message

    @property
    def loaded(self) -> list[str]:
        return list(self._engines)

    def choices(self) -> list[str]:
        return list(dict.fromkeys([self.default, *SUGGESTED, *self._engines]))

    def _adapter(self, name: str):
        if self._loader is not None:
            return self._loader(name, self.device, self.dtype)
        return load_adapter(name, device=self.device, dtype=self.dtype)

    def _load(self, name: str) -> ModelService:
        with self._lock:
            if name in self._engines:
                self._engines.move_to_end(name)
                return self._engines[name]
            refused = self.policy.refusal(name)
            if refused:
                raise ModelLoadError(f"Could not load {short(name)} ({refused}).", refused)
            try:
                adapter = self._adapter(name)
            except Exception as e:  # noqa: BLE001 - any failure is reported, the app stays up
                gc.collect()
                raise ModelLoadError(describe_load_error(name, e), load_error_reason(e)) from e
            self._engines[name] = ModelService(adapter, name=name, cache=self.cache)
            while len(self._engines) > self.max_loaded:
                victim = next((k for k in self._engines if k not in (self.fallback, name)), None)
                if victim is None:
                    break
                del self._engines[victim]
                gc.collect()
            return self._engines[name]

    def get(self, name: str | None) -> tuple[ModelService, str]:
        """(engine, message). An empty name means the default; a failed load returns the fallback
        engine and a message saying so (the message is empty on success)."""
        name = (name or "").strip() or self.default
        try:
            return self._load(name), ""
        except ModelLoadError as e:
            return self._load(self.fallback), f"{e} Showing the embedded model {self.fallback!r} instead."


__all__ = ["EMBEDDED", "ModelHub", "ModelLoadError", "OFFLINE", "SUGGESTED", "describe_load_error", "hub_reachable",
           "load_error_reason"]
