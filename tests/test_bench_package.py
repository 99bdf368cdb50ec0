"""The bench in the package: every mipruner.bench module imports without gradio (the library never imports the
app's UI library), the acceptance tooling is not in it (tests/gpu_check), and the commands share one CLI."""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import mipruner.bench
from mipruner.bench import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = sorted(m.name for m in pkgutil.iter_modules(mipruner.bench.__path__))


def test_mipruner_and_every_bench_module_import_with_gradio_blocked():
    code = ("import importlib, sys\n"
            "sys.modules['gradio'] = None  # any `import gradio` now raises ImportError\n"
            "import mipruner\n"
            f"for name in {BENCH!r}:\n"
            "    importlib.import_module('mipruner.bench.' + name)\n"
            "print(len([m for m in sys.modules if m.startswith('mipruner.bench.')]))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MIPRUNER_PLUGINS", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) >= len(BENCH) - 1  # every module (but __main__, counted by name) imported
    assert "__main__" in BENCH and "space_cost" in BENCH and "rows" in BENCH


def test_acceptance_tooling_is_outside_the_package():
    assert not [m for m in BENCH if m.startswith("gpu_check")]
    assert not [f for f in os.listdir(os.path.join(ROOT, "mipruner", "bench")) if f.startswith("gpu_check")]
    for f in ("check.py", "procs.py", "protocol.py", "rows.py", "plan.py"):
        assert os.path.isfile(os.path.join(ROOT, "tests", "gpu_check", f))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'include = ["mipruner", "mipruner.*"]' in f.read()  # only the package: tests/ never ships


def test_the_shared_cli_resolves_device_dtype_and_threads():
    import torch

    p = cli.add_run_options(cli.command_parser("x", "doc"), repeats=3, warmup=1, device=None, dtype="bf16",
                            json_help="the report")
    a = cli.parse(p, ["--device", "cpu", "--dtype", "fp16"])
    assert a.device == torch.device("cpu") and a.torch_dtype is torch.float16 and a.repeats == 3 and a.warmup == 1
    assert a.json is None and p.prog == "python -m mipruner.bench x"
    bare = cli.parse(cli.add_run_options(cli.command_parser("y", None), repeats=5), [])
    assert not hasattr(bare, "device") and not hasattr(bare, "json") and bare.repeats == 5
    assert cli.names(" mi, random,,") == ["mi", "random"]


def test_no_module_of_the_library_imports_gradio_even_deferred():
    import ast

    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, "mipruner")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for n in ast.walk(tree):
                    mods = ([a.name for a in n.names] if isinstance(n, ast.Import)
                            else [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
                    if any(m == "gradio" or m.startswith("gradio.") for m in mods):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{n.lineno}")
    assert not bad, bad
