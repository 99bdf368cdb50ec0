"""`python -m mipruner.lmms ARGS`: lmms-eval's own command line, with the `mipruner` model and our tasks.

Every argument is lmms-eval's (`python -m mipruner.lmms --help`, `... eval --help`). Before
handing over, the launcher registers the model manifest (lmms-eval 0.7 finds models only in its
registry) and appends `mipruner/lmms/tasks` to `--include_path` (to every run of a `--config`
file too), so `--tasks mipruner_pope` works next to any lmms-eval task and any `--include_path`.
Multi-process: `accelerate launch --multi_gpu --num_processes N -m mipruner.lmms ...` or
`torchrun --nproc_per_node N -m mipruner.lmms ...`.

Sweeps, in one process: alternatives separated by "|" in `--model_args`
(`method=mi|random,budget=64|128|192,lam=1`) expand into one lmms-eval run per combination, each
writing to `--output_path`/<method>[_<budget>][_<other varying settings>]; a setting is given only to
the methods that have it (lam goes to mi, not to random); `method=none` runs once, without budget.
A `--config` file listing runs works too. The model is loaded once per process (adapters are
kept), and with `cache_dir=` each item is encoded once: the first run answers every run's
configuration on each encoding (sharing MI's PMI matrices and FastV/DART's first layers) and the
later runs read their answers from the cache (`mipruner.lmms.model.SWEEP_ENV`).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import sys
import tempfile

from . import MODEL_ID, TASKS_DIR, register


def _with_tasks_dir(include_path) -> list[str]:
    if include_path in (None, ""):
        paths = []
    else:
        paths = [include_path] if isinstance(include_path, str) else list(include_path)
    return paths + [TASKS_DIR] if TASKS_DIR not in paths else paths


def expand_model_args(model_args: str) -> list[tuple[str, str]]:
    """(tag, model_args) per combination of the "|" alternatives; see the module docstring."""
    from .answer import NONE, _method_params, method_names

    pairs = [kv.split("=", 1) for kv in model_args.split(",") if kv.strip()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--model_args must be key=value[,key=value...], got {model_args!r}")
    keys = [k.strip() for k, _ in pairs]
    options = [v.split("|") for _, v in pairs]
    if "plugins" in keys:  # their methods and parameters take part in the expansion below
        from .model import load_plugins_once

        load_plugins_once(":".join(options[keys.index("plugins")]))
    methods = options[keys.index("method")] if "method" in keys else [NONE]
    known = {k for m in methods if m in method_names() for k in _method_params(m)}
    varying = [k for k, o in zip(keys, options) if len(o) > 1]
    runs, seen = [], set()
    for combo in itertools.product(*options):
        args = dict(zip(keys, combo))
        method = args.get("method", NONE)
        if method in method_names():  # unknown names are left to the model's plain error
            own = _method_params(method)
            args = {k: v for k, v in args.items() if k not in known or k in own}
            if method == NONE:
                args.pop("budget", None)
        text = ",".join(f"{k}={v}" for k, v in args.items())
        if text in seen:
            continue
        seen.add(text)
        parts = [args[k] for k in ("method", "budget") if k in args]
        parts += [f"{k}{args[k]}" for k in varying if k in args and k not in ("method", "budget")]
        tag = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p.replace("%", "pct")) for p in parts) or "run"
        runs.append((tag, text))
    return runs


def _sweep_env(model_args_list: list[str]) -> None:
    from .model import SWEEP_ENV

    os.environ[SWEEP_ENV] = json.dumps(model_args_list)


def _write_config(runs: list[dict]) -> str:
    import yaml

    fd, out = tempfile.mkstemp(prefix="mipruner-lmms-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(runs, f)
    return out


def _config_with_tasks_dir(path: str, cli_model_args: str = "") -> str:
    """A copy of a `--config` YAML whose every run also includes our task folder; tells the model the sweep."""
    import yaml

    with open(path) as f:
        runs = yaml.safe_load(f)
    runs = runs if isinstance(runs, list) else [runs]
    for run in runs:
        run["include_path"] = _with_tasks_dir(run.get("include_path"))
    _sweep_env([cli_model_args or run.get("model_args", "") for run in runs if run.get("model") == MODEL_ID])
    return _write_config(runs)


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

    parser, args = parse_eval_args()
    if args.config:
        args.config = _config_with_tasks_dir(args.config, args.model_args)
        if args.include_path:
            args.include_path = _with_tasks_dir(args.include_path)
    elif args.model == MODEL_ID and "|" in (args.model_args or ""):
        runs = expand_model_args(args.model_args)
        out = args.output_path
        args.config = _write_config([{"model_args": text, **({"output_path": os.path.join(out, tag)} if out else {})}
                                     for tag, text in runs])
        _sweep_env([text for _, text in runs])
        # the runs' own values must win over these (lmms-eval lets explicit command-line values override a config)
        args.model_args, args.output_path = parser.get_default("model_args"), parser.get_default("output_path")
        args.include_path = _with_tasks_dir(args.include_path)
    else:
        args.include_path = _with_tasks_dir(args.include_path)
    cli_evaluate(args)


if __name__ == "__main__":
    main()
    sys.exit(0)
