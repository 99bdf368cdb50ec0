"""`python -m mipruner.check_pruner NAME [--plugins MODULES]`: the contract checks the built-in methods
pass (`mipruner.testing.check_pruner`), run on method NAME; prints each failure, exit code 1 if any.

    python -m mipruner.check_pruner center --plugins my_pruners          # a module on sys.path
    python -m mipruner.check_pruner center --plugins ./my_pruners.py     # a single file
    python -m mipruner.check_pruner center                               # an installed plug-in
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mipruner.check_pruner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the registered method name")
    p.add_argument("--plugins", help="modules or .py files to import first, comma-separated (env MIPRUNER_PLUGINS too)")
    p.add_argument("--model", default="shapes-llava",
                   help="model whose encoding `select` is checked on (default: the embedded shapes-llava)")
    p.add_argument("--no-model", action="store_true", help="tensor checks only (pre-LLM methods)")
    p.add_argument("--device", default="cpu", help="device of the inputs and the model (default cpu)")
    a = p.parse_args(argv)
    from .plugins import load_for_cli
    from .testing import check_pruner

    load_for_cli(a.plugins, check=False)  # every check runs below, not only the quick one at load
    failures = check_pruner(a.name, model=None if a.no_model else a.model, device=a.device)
    for f in failures:
        print(f"FAIL {a.name}: {f}")
    if not failures:
        print(f"OK {a.name}: passes the selection contract")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
