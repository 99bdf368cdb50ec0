"""The command line the bench commands share, written once: a parser named after its command, the run options
(`--repeats`, `--warmup`, `--device`, `--dtype`, `--threads`, `--json`, each with the command's default),
their parsing (threads set, the device and dtype resolved), comma lists and the JSON report."""
from __future__ import annotations

import argparse
import json

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_OMIT = object()


def command_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """`python -m mipruner.bench <command>`'s parser, its module docstring as the description."""
    return argparse.ArgumentParser(prog=f"python -m mipruner.bench {command}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_run_options(p: argparse.ArgumentParser, *, repeats: int, repeats_help: str | None = None, warmup=_OMIT,
                    device=_OMIT, dtype=_OMIT, json_help=_OMIT) -> argparse.ArgumentParser:
    """The run options, each added only where a default is given (`device=None`: CUDA when available, else the
    CPU; `dtype`: a key of DTYPES; `json_help`: what the file holds). `--threads` always (torch's own by
    default)."""
    p.add_argument("--repeats", type=int, default=repeats, help=repeats_help or "timed runs per cell")
    if warmup is not _OMIT:
        p.add_argument("--warmup", type=int, default=warmup, help="untimed runs per cell before the timed ones")
    if device is not _OMIT:
        p.add_argument("--device", default=device, help="default: " + (device or "cuda when available, else cpu"))
    if dtype is not _OMIT:
        p.add_argument("--dtype", default=dtype, choices=tuple(DTYPES))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    if json_help is not _OMIT:
        p.add_argument("--json", help=json_help)
    return p


def parse(p: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """`p.parse_args(argv)` with torch's threads set (`--threads`), `device` a torch.device (CUDA when
    available where none was given) and `torch_dtype` the dtype of `--dtype`, where the command has them."""
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if hasattr(a, "device"):
        a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if hasattr(a, "dtype"):
        a.torch_dtype = DTYPES[a.dtype]
    return a


def names(text: str) -> list[str]:
    """The names of a comma-separated option ('mi, random,' -> ['mi', 'random'])."""
    return [x.strip() for x in text.split(",") if x.strip()]


def write_json(path: str | None, obj) -> None:
    """The report as indented JSON at `path` (nothing when None)."""
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


__all__ = ["DTYPES", "add_run_options", "command_parser", "names", "parse", "write_json"]
