"""The example plug-in package (examples/plugin) installed as a user would, outside the repository
(`pip install --target`, offline: --no-index, no build isolation), then found through its entry point:
in `mipruner.list_pruners()`, `python -m mipruner.check_pruner`, `python -m mipruner.eval`,
`python -m mipruner.bench` and the app's API (/encode, /view, /settings, /export, /sweep) next to MI,
with a broken plug-in beside it named once while everything else serves."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "plugin")
IMAGE = os.path.join(ROOT, "assets", "examples", "scene_0.png")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """examples/plugin installed into a temporary folder (a copy is built: the repository stays clean)."""
    src = tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(EXAMPLE, src)
    out = str(tmp_path_factory.mktemp("site"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", out, str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert os.path.isdir(os.path.join(out, "mipruner_stride"))
    return out


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A plug-in file that fails to import, and a marker module that records being imported."""
    d = tmp_path_factory.mktemp("broken")
    (d / "broken_plugin.py").write_text("import no_such_module_anywhere\n")
    marker = d / "imported.txt"
    (d / "tripwire.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    return str(d / "broken_plugin.py"), str(d), str(marker)


def env(target, *extra) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
             PYTHONPATH=os.pathsep.join([ROOT, target, *extra]))
    e.pop("MIPRUNER_PLUGINS", None)
    return e


def run(target, *args, extra=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env(target, *extra), capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_installed_plugin_is_listed_lazily(target):
    code = ("import sys, mipruner\n"
            "assert 'mipruner_stride.stride' not in sys.modules\n"
            "print(mipruner.list_pruners()); print(mipruner.plugins.origin('stride'))\n")
    r = run(target, "-c", code)
    assert r.returncode == 0, r.stderr
    names, origin = r.stdout.strip().splitlines()
    assert "'stride'" in names and "'mi'" in names
    assert origin == "'stride' (entry point mipruner_stride.stride)"
    r = run(target, "-m", "mipruner.check_pruner", "stride")
    assert r.returncode == 0 and "OK stride" in r.stdout, r.stdout + r.stderr


def test_eval_runs_the_plugin_next_to_mi_and_a_broken_one_is_one_line(target, broken, tmp_path):
    out = tmp_path / "rows.json"
    r = run(target, "-m", "mipruner.eval", "--model", "shapes-llava", "--task", "shapes-pope", "--n", "2",
            "--methods", "stride,mi", "--budgets", "8", "--stride-phase", "0.25", "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert {row["method"] for row in rows} == {"none", "stride", "mi"}
    stride = [row for row in rows if row["method"] == "stride"]
    assert {row["split"] for row in stride} == {"adversarial", "popular", "random", "average"}
    assert all(row["budget"] == 8 and 0 <= row["acc"] <= 1 for row in stride)
    assert "Plug-in" not in r.stderr
    r = run(target, "-m", "mipruner.eval", "--plugins", broken[0], "--n", "1", "--methods", "mi,stride",
            "--budgets", "8", "--no-progress")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "Plug-in" in line]
    assert lines == [f"Plug-in {broken[0]!r} (--plugins) was not loaded: ModuleNotFoundError: "
                     "No module named 'no_such_module_anywhere'."]
    assert "stride " in r.stdout and "mi " in r.stdout


def test_bench_times_the_plugin(target):
    r = run(target, "-m", "mipruner.bench", "pruners", "--sizes", "64", "--dim", "16", "--text", "4", "--budgets", "8",
            "--methods", "stride,similarity", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    assert "stride" in r.stdout and "similarity" in r.stdout


@pytest.fixture(scope="module")
def app(target, broken):
    """app.py with the installed plug-in, a broken one named by --plugins and a visitor-reachable tripwire."""
    from .app.conftest import app_process

    log = os.path.join(os.path.dirname(broken[0]), "app.log")
    with app_process(["--plugins", broken[0]], env(target, broken[1]), log) as client:
        yield client, log


def test_the_app_serves_the_plugin_next_to_mi(app, broken):
    from gradio_client import handle_file

    client, log = app
    one = (f"Plug-in {broken[0]!r} (--plugins) was not loaded: ModuleNotFoundError: No module named "
           "'no_such_module_anywhere'.")
    status = client.predict(model="shapes-llava", model_path="", use="image", image=handle_file(IMAGE), video=None,
                            prompt="Is there a red circle?", api_name="/encode")[0]
    assert "196 visual tokens" in status and status.count("Plug-in") == 1 and one in status
    assert open(log).read().count(one) == 1  # and once on the server's stderr
    # /view: the plug-in's panel next to MI's, its parameter a control of its own, in the settings string
    view = client.predict(methods=["stride", "mi"], unit="tokens", budget=16, stride_phase=0.25, api_name="/view")[-2]
    assert [(m["method"], m["kept"]) for m in view["methods"]] == [("stride", 16), ("mi", 16)]
    n, k = 196, 16
    assert view["methods"][0]["keep"] == [(i * n + int(0.25 * (n - k))) // k for i in range(k)]
    assert "m=stride,mi" in view["settings"] and "sp=0.25" in view["settings"]
    controls = client.predict("m=stride,mi&b=16&sp=1.0", api_name="/settings")
    # the plug-in's control comes after the built-in parameters, before the per-frame split (always last)
    assert controls[0] == ["stride", "mi"] and tuple(controls[-2:]) == (1.0, "off"), controls
    files = [os.path.basename(f) for f in client.predict(methods=["stride", "mi"], unit="tokens", budget=16,
                                                          api_name="/export")]
    assert {"stride_mask.png", "stride_selection.json", "mi_mask.png", "view.json"} <= set(files)


def test_the_sweep_area_sweeps_the_plugin_parameter(app):
    client, _ = app
    out = client.predict(sweep_methods=["stride", "mi"], sweep_param="stride_phase", sweep_values="0,1", sweep_budget=8,
                         n_items=2, zip=None, questions=None, model_path="", api_name="/sweep")
    table = out[-1]
    rows = {(r[0], r[1]) for r in table["data"]}
    assert {("Stride (example plug-in)", "0.0"), ("Stride (example plug-in)", "1.0")} <= rows


def test_a_visitor_cannot_load_a_module(app, broken):
    client, _ = app
    with pytest.raises(Exception, match="tripwire"):
        client.predict("m=tripwire,mi", api_name="/settings")
    with pytest.raises(Exception):
        client.predict(methods=["tripwire"], unit="tokens", budget=16, api_name="/view")
    assert not os.path.exists(broken[2])  # the module on the server's path was never imported


def test_the_lmms_eval_model_takes_plugins_from_model_args(broken):
    """`--model_args plugins=a.py:b.py,method=NAME`: a file plug-in becomes a method of the lmms-eval model;
    a broken one is one warning naming it and the model still builds."""
    if not os.environ.get("MIPRUNER_REQUIRE_LMMS"):
        pytest.importorskip("lmms_eval", reason="lmms-eval is installed by .ci/run (requirements-lmms.txt)")
    stride = os.path.join(EXAMPLE, "mipruner_stride", "stride.py")
    code = ("import logging, sys\n"
            "from mipruner.lmms.model import MiPruner\n"
            f"m = MiPruner(pretrained='shapes-llava', method='stride', budget=8, stride_phase=0.25, "
            f"plugins={(broken[0] + os.pathsep + stride)!r}, device='cpu')\n"
            "print(m.config.method, m.config.params)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env("", broken[1]), capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "stride {'stride_phase': 0.25}"
    assert r.stderr.count(f"Plug-in {broken[0]!r} (model_args plugins=) was not loaded") == 1, r.stderr
