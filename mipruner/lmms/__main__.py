"""`python -m mipruner.lmms ARGS`: lmms-eval's own command line, with the `mipruner` model and our tasks.

Every argument is lmms-eval's (`python -m mipruner.lmms --help`, `... eval --help`). Before
handing over, the launcher registers the model manifest (lmms-eval 0.7 finds models only in its
registry) and appends `mipruner/lmms/tasks` to `--include_path` (to every run of a `--config`
file too), so `--tasks mipruner_pope` works next to any lmms-eval task and any `--include_path`.
Multi-process: `accelerate launch --multi_gpu --num_processes N -m mipruner.lmms ...` or
`torchrun --nproc_per_node N -m mipruner.lmms ...`.
"""
from __future__ import annotations

import os
import sys
import tempfile

from . import TASKS_DIR, register


def _with_tasks_dir(include_path) -> list[str]:
    paths = [] if include_path in (None, "") else ([include_path] if isinstance(include_path, str) else list(include_path))
    return paths + [TASKS_DIR] if TASKS_DIR not in paths else paths


def _config_with_tasks_dir(path: str) -> str:
    """A copy of a `--config` YAML whose every run also includes our task folder."""
    import yaml

    with open(path) as f:
        runs = yaml.safe_load(f)
    runs = runs if isinstance(runs, list) else [runs]
    for run in runs:
        run["include_path"] = _with_tasks_dir(run.get("include_path"))
    fd, out = tempfile.mkstemp(prefix="mipruner-lmms-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(runs, f)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    register()
    is_eval = bool(argv) and (argv[0] == "eval" or argv[0].startswith("-")) and argv not in (["-h"], ["--help"]) \
        and "--tui" not in argv and argv != ["eval"]
    if not is_eval:  # subcommands (tasks, models, version, ...) and help: lmms-eval's dispatcher as is
        from lmms_eval.cli.dispatch import main as dispatch

        sys.argv = ["lmms-eval"] + argv
        dispatch()
        return
    sys.argv = ["lmms-eval"] + (argv[1:] if argv[0] == "eval" else argv)
    from lmms_eval.__main__ import cli_evaluate, parse_eval_args

    _, args = parse_eval_args()
    if args.config:
        args.config = _config_with_tasks_dir(args.config)
        if args.include_path:
            args.include_path = _with_tasks_dir(args.include_path)
    else:
        args.include_path = _with_tasks_dir(args.include_path)
    cli_evaluate(args)


if __name__ == "__main__":
    main()
    sys.exit(0)
