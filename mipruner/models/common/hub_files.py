"""Files of a local checkpoint directory or a cached hub checkpoint, read as transformers reads them
(never downloaded here: `cached_file` without connection errors), for every family."""
from __future__ import annotations

import json
import os


def read_json(path: str, name: str) -> dict:
    """A JSON file of a local checkpoint directory or a cached hub checkpoint; {} when absent."""
    local = os.path.join(path, name)
    if not os.path.isfile(local):
        try:
            from transformers.utils import cached_file
            local = cached_file(path, name, _raise_exceptions_for_missing_entries=False,
                                _raise_exceptions_for_connection_errors=False)
        except (OSError, ValueError):
            local = None
    if not local or not os.path.isfile(local):
        return {}
    with open(local) as f:
        return json.load(f)


def video_processor_dict(path: str) -> dict:
    """The dict transformers builds the video processor from (see the module doc for the order)."""
    nested = read_json(path, "processor_config.json").get("video_processor")
    if nested:
        return dict(nested)
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        found = read_json(path, name)
        if found:
            return found
    return {}



def read_chat_template(path: str, tok):
    """The checkpoint's chat template: chat_template.jinja, else chat_template.json, else the tokenizer's."""
    local = os.path.join(path, "chat_template.jinja")
    if not os.path.isfile(local):
        try:
            from transformers.utils import cached_file
            local = cached_file(path, "chat_template.jinja", _raise_exceptions_for_missing_entries=False,
                                _raise_exceptions_for_connection_errors=False)
        except (OSError, ValueError):
            local = None
    if local and os.path.isfile(local):
        with open(local) as f:
            return f.read()
    return read_json(path, "chat_template.json").get("chat_template") or getattr(tok, "chat_template", None)


__all__ = ["read_chat_template", "read_json", "video_processor_dict"]
