"""Every flag a command's `--help` offers is described on some docs page (README.md, docs/*.md), and every
flag of app.py on docs/app.md. The commands: app.py, `python -m mipruner.eval` and its `sweep`, every
`python -m mipruner.bench` command (from its own table), the GPU acceptance check `python -m tests.gpu_check
run`, `mipruner.check_pruner`, `mipruner.lmms` (lmms-eval's
own command line: its flags are lmms-eval's), `mipruner.lmms.make_tasks`, `mipruner.lmms.table` and
`mipruner.shapes.train`. A method parameter's generated option (`--dominant-ratio` for `dominant_ratio`:
mipruner/eval/cli_options.py) counts as described where docs/methods.md names the parameter and
docs/evaluation.md states the rule."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mipruner.bench.__main__ import COMMANDS as BENCH
from mipruner.pruners import all_params

from .test_docs import PAGES, read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = [["app.py"], ["-m", "mipruner.eval"], ["-m", "mipruner.eval", "sweep"], ["-m", "mipruner.check_pruner"],
            ["-m", "mipruner.lmms"], ["-m", "mipruner.lmms.make_tasks"], ["-m", "mipruner.lmms.table"],
            ["-m", "mipruner.shapes.train"], *(["-m", "mipruner.bench", name] for name in BENCH),
            ["-m", "tests.gpu_check", "run"]]
RULE = "Every method parameter is also an option"  # the sentence of docs/evaluation.md that states the rule


def usage_flags(args: list[str]) -> list[str]:
    """The long options of a command's usage lines (argparse wraps them between whole options)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MIPRUNER_PLUGINS", None)
    run = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("usage:"), run.stdout[-2000:] + run.stderr[-2000:]
    usage = run.stdout.split("\n\n", 1)[0]
    return sorted(set(re.findall(r"--[A-Za-z][\w-]*", usage)) - {"--help"})


def described(flag: str, text: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def named(word: str, text: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None


def test_the_flag_extraction_reads_wrapped_usage_lines():
    assert "--eval-seed" in usage_flags(["-m", "mipruner.shapes.train"])


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:] if a[0] == "-m" else a))
def test_every_flag_is_described_in_the_docs(args):
    docs = "\n".join(read(p) for p in PAGES)
    methods = read(os.path.join(ROOT, "docs", "methods.md"))
    params = {f"--{name.replace('_', '-')}": name for name in all_params()}
    rule = RULE in read(os.path.join(ROOT, "docs", "evaluation.md"))
    missing = [f for f in usage_flags(args) if not described(f, docs)
               and not (rule and f in params and named(params[f], methods))]
    assert not missing, f"{' '.join(args)}: flags that no page (README.md, docs/*.md) describes: {missing}"


def test_every_app_flag_is_on_the_app_page():
    page = read(os.path.join(ROOT, "docs", "app.md"))
    missing = [f for f in usage_flags(["app.py"]) if not described(f, page)]
    assert not missing, f"docs/app.md does not describe {missing}"
