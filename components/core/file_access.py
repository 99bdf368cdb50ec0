"""Which files a request may name: only those in Gradio's upload cache or the app's own assets.

A file input (image, video, zip, gallery) arrives as a path in one of several shapes: Gradio's tagged
FileData dict, an untagged dict, a bare string, or a list of those (a video's `{"video": {...}}`, a
gallery's `{"image": {...}, "caption": ...}`). Gradio checks a path only for a tagged dict, so every
shape is read here and each path is accepted only when its real path (symlinks resolved,
`os.path.realpath`) is a file under one of the allowed folders. A path outside them, or missing, gets one
and the same sentence, so a reply never tells whether a file exists on the server. No Gradio here:
`components.page.guards` passes the folders Gradio uses and runs the check for every event.
"""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS_DIR = os.path.join(ROOT, "assets")  # the embedded model, the examples, the sweeps' sets
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)


def not_uploaded(name: str) -> str:
    """The one sentence for a path this server does not open (outside the allowed folders, or missing)."""
    return (f"{name}: this server opens only files uploaded to it; upload the file and try again "
            "(gradio_client: handle_file)")


def from_web(name: str) -> str:
    return (f"{name}: this server does not fetch files from the web; upload the file instead "
            "(gradio_client: handle_file with a local path)")


def payload_paths(payload) -> list[tuple[str, str]]:
    """("path" | "url", text) of every file a file input's payload names, whatever its shape: a dict's
    "path" (its "url" only when it has no path), a bare string, and the same inside lists and nested
    dicts. Other strings in a dict (orig_name, mime_type, caption) are not paths."""
    out: list[tuple[str, str]] = []

    def walk(p, depth: int = 0) -> None:
        if depth > 8 or p is None:
            return
        if isinstance(p, str):
            out.append(("path", p))
        elif isinstance(p, dict):
            path, url = p.get("path"), p.get("url")
            if isinstance(path, str) and path:
                out.append(("path", path))
            elif isinstance(url, str) and url:
                out.append(("url", url))
            elif path is not None and not isinstance(path, str):
                walk(path, depth + 1)
            for k, v in p.items():
                if k not in ("path", "url") and isinstance(v, (dict, list, tuple)):
                    walk(v, depth + 1)
        elif isinstance(p, (list, tuple)):
            for v in p:
                walk(v, depth + 1)

    walk(payload)
    return out


def real_roots(folders) -> tuple[str, ...]:
    """The folders' real paths (symlinks resolved), each once."""
    return tuple(dict.fromkeys(os.path.realpath(f) for f in folders if f))


def inside(path: str, roots) -> bool:
    """Whether `path`, symlinks resolved, is a file under one of `roots` (real paths, `real_roots`)."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return os.path.isfile(real) and any(real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def file_problem(name: str, payload, roots) -> str | None:
    """Why the file input `name` may not read `payload`, or None when every file it names is allowed.
    roots: the allowed folders' real paths (`real_roots`)."""
    for kind, text in payload_paths(payload):
        if _URL.match(text) or kind == "url":
            return from_web(name)
        if "\x00" in text or not inside(text, roots):
            return not_uploaded(name)
    return None


__all__ = ["ASSETS_DIR", "file_problem", "from_web", "inside", "not_uploaded", "payload_paths", "real_roots"]
