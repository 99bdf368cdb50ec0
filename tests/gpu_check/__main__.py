"""`python -m tests.gpu_check run [options]` is the GPU acceptance check (tests/gpu_check/check.py; `run --help`);
`python -m tests.gpu_check plan [--limit-s S] [--plan-from REPORT] [run options]` prints it as commands that
each fit a lent machine's per-call limit; `python -m tests.gpu_check merge A.json B.json ... --json ALL.json`
joins their reports (tests/gpu_check/plan.py). From the repository root."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from .plan import merge_main, plan

    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    if argv[:1] == ["run"]:  # --plugins (or env MIPRUNER_PLUGINS) as every mipruner command takes it
        from mipruner.plugins import load_for_cli, take_plugins_arg

        from . import check

        rest, plugins = take_plugins_arg(argv[1:])
        load_for_cli(plugins)
        rc = check.main(rest)
        return rc if isinstance(rc, int) else 0
    if argv[:1] != ["plan"]:
        print(__doc__)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    from . import check as gpu_check

    p = argparse.ArgumentParser(prog="python -m tests.gpu_check plan", add_help=False)
    p.add_argument("--limit-s", type=float, default=600.0, help="each command's time limit (seconds)")
    p.add_argument("--plan-from", default=None, metavar="REPORT",
                   help="per-family seconds from this report (default: the first H100 run's)")
    own, rest = p.parse_known_args(argv[1:])
    a = gpu_check.parse_args(rest)
    a.command, a.limit_s, a.plan_from = rest, own.limit_s, own.plan_from
    print(plan(a, gpu_check.settings(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
