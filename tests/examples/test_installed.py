"""The example plug-ins PyramidDrop (in-LLM) and LLaVA-PruMerge (adaptive, merging) installed as a
user would, outside the repository (`pip install --target`, offline), then found through their entry
points: `python -m mipruner.check_pruner NAME` passes and `python -m mipruner.eval --methods NAME,mi`
runs on the embedded model (PruMerge's eval rows show the K it chose, under the budget); the app's
/view (gradio_client) shows both panels next to MI's; and neither example imports a private mipruner
module (their imports read from the source)."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = {"pyramiddrop": "mipruner_pyramiddrop", "prumerge": "mipruner_prumerge"}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("site"))
    for folder, package in EXAMPLES.items():
        src = tmp_path_factory.mktemp("src") / folder
        shutil.copytree(ROOT / "examples" / folder, src)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--no-index", "--target", out, str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert os.path.isdir(os.path.join(out, package))
    return out


def run(target, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), target]))
    env.pop("MIPRUNER_PLUGINS", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_installed_example_passes_the_checker(target, name):
    r = run(target, "-m", "mipruner.check_pruner", name)
    assert r.returncode == 0 and f"OK {name}" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_installed_example_runs_in_eval_next_to_mi(target, name, tmp_path):
    out = tmp_path / "rows.json"
    r = run(target, "-m", "mipruner.eval", "--model", "shapes-llava", "--task", "shapes-pope", "--n", "2",
            "--methods", f"{name},mi", "--budgets", "24", "--no-progress", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert {row["method"] for row in rows} == {"none", name, "mi"}
    mine = [row for row in rows if row["method"] == name]
    assert all(row["budget"] == 24 and 0 <= row["acc"] <= 1 for row in mine)
    if name == "prumerge":  # K chosen per input, capped by the budget
        assert all(1 <= row["kept"] <= 24 for row in mine)
    else:
        assert all(row["kept"] == 24 for row in mine)


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_examples_import_no_private_mipruner_module():
    seen = []
    for folder in EXAMPLES:
        for path in (ROOT / "examples" / folder).rglob("*.py"):
            for name in _imports(path):
                if name.split(".")[0] == "mipruner":
                    seen.append(name)
                    assert not any(part.startswith("_") for part in name.split(".")), (path, name)
    assert "mipruner.inllm.register_inllm" in seen and "mipruner.register_pruner" in seen


@pytest.fixture(scope="module")
def app(target, tmp_path_factory):
    """app.py with both installed examples (entry points), on a free port."""
    from ..app.conftest import app_process

    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), target]))
    env.pop("MIPRUNER_PLUGINS", None)
    with app_process([], env, tmp_path_factory.mktemp("app") / "app.log") as client:
        yield client


def test_the_app_shows_both_next_to_mi(app):
    from gradio_client import handle_file

    image = ROOT / "assets" / "examples" / "scene_0.png"
    status = app.predict(model="shapes-llava", model_path="", use="image", image=handle_file(str(image)), video=None,
                         prompt="Is there a red circle?", api_name="/encode")[0]
    assert "196 visual tokens" in status and "Plug-in" not in status
    view = app.predict(methods=["prumerge", "pyramiddrop", "mi"], unit="tokens", budget=32, api_name="/view")[-2]
    kept = {m["method"]: m["kept"] for m in view["methods"]}
    assert kept["pyramiddrop"] == kept["mi"] == 32 and 1 <= kept["prumerge"] <= 32


def test_the_lmms_eval_model_answers_with_both(target):
    """The lmms-eval model built with each installed example (`method=NAME`) answers through its one
    path (`mipruner.lmms.answer.answer_encoded`), PruMerge at the K it chose."""
    if not os.environ.get("MIPRUNER_REQUIRE_LMMS"):
        pytest.importorskip("lmms_eval", reason="lmms-eval is installed by .ci/run (requirements-lmms.txt)")
    image = ROOT / "assets" / "examples" / "scene_0.png"
    code = ("from PIL import Image\n"
            "from mipruner.lmms.model import MiPruner\n"
            "from mipruner.lmms.answer import answer_encoded\n"
            "for name in ('pyramiddrop', 'prumerge'):\n"
            "    m = MiPruner(pretrained='shapes-llava', method=name, budget=24, device='cpu')\n"
            f"    enc = m.adapter.encode(Image.open({str(image)!r}).convert('RGB'), 'Is there a red circle?', "
            "need_attention=True)\n"
            "    a = answer_encoded(m.adapter, enc, m.config, 4, {})\n"
            "    print(name, m.config.method, 1 <= a.visual_tokens <= 24, bool(a.token_ids))\n")
    r = run(target, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-2:] == ["pyramiddrop pyramiddrop True True", "prumerge prumerge True True"]
