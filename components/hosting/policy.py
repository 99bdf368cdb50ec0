"""Which models a visitor may load: an allow-list, a size cap read before any download, and the
local folders models may come from.

On a shared server the "model id or local path" field must not let one visitor start a 150 GB
download that fills the disk and memory for everyone, nor probe the server's folders. So:

- ids are checked against `allow` (ids or glob patterns, e.g. "llava-hf/*"; None = any id);
- a hub id's checkpoint size is read from the hub's metadata (`huggingface_hub.model_info` with
  file sizes; the safetensors parameter counts when sizes are missing) BEFORE anything is
  downloaded, and refused above `max_bytes`; when the metadata cannot be read, only a checkpoint
  already in the local cache is loaded (nothing would be downloaded);
- a local path is loaded only from inside one of `model_dirs` (none by default);
- `trusted` names (the embedded model and the operator's start-up model) skip the checks.

Models are loaded without `trust_remote_code`: only the families mipruner supports, with
transformers' own code. `is_hosted` tells a shared server (a Space, a public share link, or bound
to a non-loopback address) from a local one; app.py picks the defaults from it.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Callable

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")  # what transformers downloads (safetensors first)
DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I8": 1, "U8": 1, "BOOL": 1}


def is_hosted(host: str | None, share: bool = False, env=None) -> bool:
    """True on a Hugging Face Space (SPACE_ID set), with a public share link, or when bound to an
    address other than loopback (anyone on the network can reach it)."""
    env = os.environ if env is None else env
    if env.get("SPACE_ID") or share:
        return True
    host = (host or "127.0.0.1").strip().strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name other than localhost: reachable from elsewhere


def hub_checkpoint_bytes(repo_id: str) -> int | None:
    """Bytes of the weights transformers would download for `repo_id`, from the hub's metadata
    (no download): the .safetensors files when there are any, else .bin / .pt; the safetensors
    parameter counts x dtype sizes when the file sizes are missing. None when it says nothing."""
    import huggingface_hub

    info = huggingface_hub.model_info(repo_id, files_metadata=True, timeout=10)
    files = [(s.rfilename, s.size) for s in (info.siblings or [])]
    for suffixes in ((".safetensors",), WEIGHT_SUFFIXES[1:]):
        sizes = [size for f, size in files if f.endswith(suffixes)]
        if sizes and all(size is not None for size in sizes):
            return int(sum(sizes))
    st = getattr(info, "safetensors", None)
    params = getattr(st, "parameters", None) or {}
    if params:
        return int(sum(n * DTYPE_BYTES.get(dtype.upper(), 4) for dtype, n in params.items()))
    return None


def cached_locally(repo_id: str) -> bool:
    """Whether the checkpoint's config is already in the local hub cache (no download needed)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an unreadable cache is no cache
        return False


def looks_local(name: str) -> bool:
    """A filesystem path rather than a hub id, from its spelling alone (whether it exists here is
    not looked up, so the answer tells a visitor nothing about the server's folders): absolute,
    ./ ../ ~, a backslash, or more than one '/'."""
    return name.startswith(("/", "./", "../", "~")) or "\\" in name or name.count("/") > 1 or ".." in name


@dataclass
class ModelPolicy:
    """What may be loaded (see the module docstring). Defaults: anything, no size cap, no folders."""

    allow: tuple[str, ...] | None = None
    max_bytes: int | None = None
    model_dirs: tuple[str, ...] = ()
    trusted: tuple[str, ...] = ()
    size_of: Callable[[str], int | None] = hub_checkpoint_bytes

    def refusal(self, name: str) -> str:
        """Why `name` may not be loaded, in plain words ("" when it may)."""
        if name in self.trusted:
            return ""
        if looks_local(name):
            return self._local_refusal(name)
        if not HUB_ID.match(name):
            return "this is neither a model id like 'owner/name' nor a folder this server offers"
        if self.allow is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.allow):
            shown = ", ".join(self.allow[:8]) + (", ..." if len(self.allow) > 8 else "")
            return f"this server only loads these models: {shown}"
        if self.max_bytes is None:
            return ""
        try:
            size = self.size_of(name)
        except Exception as e:  # noqa: BLE001 - offline, no such repo, gated, ...
            if cached_locally(name):
                return ""
            why = ("no such model on the hub; for a local folder give its full path" if "NotFound" in type(e).__name__
                   else "the model hub cannot be reached")
            return f"its size cannot be read from the model hub ({why}), so it is not downloaded"
        if size is None:
            return "the model hub lists no weights for it"
        if size > self.max_bytes:
            return (f"its checkpoint is {size / 1e9:.1f} GB; this server loads checkpoints of at most "
                    f"{self.max_bytes / 1e9:.1f} GB")
        return ""

    def _local_refusal(self, name: str) -> str:
        if not self.model_dirs:
            return "this server loads no models from local folders"
        real = os.path.realpath(os.path.expanduser(name))
        for d in self.model_dirs:
            root = os.path.realpath(os.path.expanduser(d))
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return ""
        return "this server loads local models only from the folders it was started with"


__all__ = ["ModelPolicy", "cached_locally", "hub_checkpoint_bytes", "is_hosted", "looks_local"]
