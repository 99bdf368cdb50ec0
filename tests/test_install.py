"""The package installs as a new user installs it, outside the repository: the wheel ships the embedded
model (assets/shapes-llava, copied into mipruner/_assets by setup.py), so that `mipruner.load("shapes-llava")`
answers and `mipruner-eval` runs from a folder that is not the checkout. Offline: the wheel is built
without build isolation and installed with --no-deps into a folder on PYTHONPATH (a venv made from inside
a venv would see the base interpreter's packages, not the running one's)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = sorted(os.listdir(os.path.join(ROOT, "assets", "shapes-llava")))


def outside_checkout(p: str) -> bool:
    real, root = os.path.realpath(p), os.path.realpath(ROOT)
    return real != root and not real.startswith(root + os.sep)


def test_the_wheel_ships_the_embedded_model_and_it_answers_outside_the_repository(tmp_path):
    src, dist, target, elsewhere = (tmp_path / d for d in ("src", "dist", "target", "elsewhere"))
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "tests", "__pycache__", "build", "*.egg-info",
                                                             "outputs", "runs"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                        str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    wheel = next(dist.glob("mipruner-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        shipped = sorted(n.rsplit("/", 1)[1] for n in z.namelist() if n.startswith("mipruner/_assets/shapes-llava/"))
        assert not [n for n in z.namelist() if n.startswith("tests/") or "gpu_check" in n]  # the maintainers' tools (tests/gpu_check) stay out
    assert shipped == MODEL
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *(p for p in sys.path if p and outside_checkout(p))]),
           "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MIPRUNER_PLUGINS", None)
    image = os.path.join(ROOT, "assets", "examples", "scene_3.png")
    code = ("import mipruner\n"
            "adapter = mipruner.load('shapes-llava')\n"
            f"enc = adapter.encode({image!r}, 'what color is the triangle?')\n"
            "sel = mipruner.select(adapter, enc, 'mi', 16)\n"
            "print(mipruner.__file__)\n"
            "print(mipruner.models.resolve('shapes-llava'))\n"
            "print(len(sel.keep), repr(mipruner.answer(adapter, enc, sel, max_new_tokens=4).text))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    where, model, answer = r.stdout.strip().splitlines()[-3:]
    assert where.startswith(str(target)) and model == str(target / "mipruner" / "_assets" / "shapes-llava")
    kept, text = answer.split(" ", 1)
    assert kept == "16" and text.strip("'\"")
    # the installed console script, from the same folder: the embedded model on the embedded task
    script = target / "bin" / "mipruner-eval"
    r = subprocess.run([sys.executable, str(script), "--n", "1", "--methods", "mi", "--budgets", "8", "--no-progress"],
                       capture_output=True, text=True, cwd=elsewhere, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert any(line.split()[:3] == ["mi", "8", "average"] for line in r.stdout.splitlines()), r.stdout
    assert not list(elsewhere.iterdir())  # nothing written where it ran
