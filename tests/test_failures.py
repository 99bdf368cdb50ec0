"""A broken method costs its own result: in `python -m mipruner.eval` (rows marked failed with the
sentence, the others complete, exit code 1), in sweeps (failed records, `failures`, exit code 1) and in
the engine behind the app (its panel and its answer carry the sentence; the other panels render)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import mipruner
from mipruner.serve.service import ModelService
from mipruner.eval.runner import evaluate
from mipruner.eval.shapes import shapes_items
from mipruner.eval.sweep import run_sweep
from mipruner.eval.sweep.spec import Sweep
from mipruner.serve.failures import guarded, sentence
from mipruner.pruners._registry import ContractError, get_pruner

from .conftest import raising_method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.path.join(ROOT, "assets", "examples", "scene_3.png")
PLUGIN = '''import torch
import mipruner


@mipruner.register_pruner("boom_file", label="Boom")
def boom(visual, text, budget):
    """Raises on inputs of more than 100 tokens (the embedded model's images, not the load-time check's 48)."""
    if visual.shape[0] > 100:
        raise RuntimeError("boom on a real image")
    return mipruner.Selection.from_order(torch.arange(budget, device=visual.device), torch.zeros(visual.shape[0], device=visual.device))
'''


@pytest.fixture(scope="module")
def boom():
    yield from raising_method("boom_test", "boom\nsecond line")


@pytest.fixture(scope="module")
def adapter():
    return mipruner.load("shapes-llava")


def test_the_sentence_is_one_line_naming_the_method():
    assert sentence("x", RuntimeError("bad\nmore")) == "'x' failed: RuntimeError: bad"
    assert sentence(None, ValueError()) == "the unpruned answer failed: ValueError"
    err = ContractError(get_pruner("mi"), "keep has shape (3,)")
    assert sentence("mi", err) == str(err)
    assert guarded("x", lambda: 3) == (3, None)
    with pytest.raises(KeyboardInterrupt):
        guarded("x", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))


def test_eval_records_the_broken_method_as_failed_and_completes_the_others(adapter, boom):
    items = shapes_items("shapes-pope", n=2, seed=7)
    rows = evaluate(adapter, items, ["none", "mi", boom], [8], {}, "shapes-pope", max_new_tokens=2)
    by = {(r["method"], r["split"]): r for r in rows}
    bad = [r for r in rows if r["method"] == boom]
    assert bad and all(r["failed"] == len(items) and r["error"] == "'boom_test' failed: RuntimeError: boom"
                       for r in bad)
    good = [r for r in rows if r["method"] in ("none", "mi")]
    assert good and all(r["failed"] == 0 and r["error"] is None and r["n"] > 0 for r in good)
    assert sum(r["n"] for (m, s), r in by.items() if m == "mi" and s != "average") == len(items)


def test_eval_cli_exits_nonzero_and_says_which_method_failed(tmp_path):
    plugin = tmp_path / "boom_plugin.py"
    plugin.write_text(PLUGIN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "mipruner.eval", "--plugins", str(plugin), "--methods", "boom_file,mi",
                          "--n", "2", "--budgets", "8", "--max-new-tokens", "2", "--no-progress"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-2000:]
    assert re.search(r"'boom_file' failed: RuntimeError: boom on a real image \(\d+ runs failed", run.stderr), run.stderr
    table = [ln.split() for ln in run.stdout.splitlines()]
    assert any(ln[:2] == ["mi", "8"] and ln[3] != "-" for ln in table if len(ln) > 3), run.stdout


def test_sweep_records_failures_and_the_others_complete(adapter, boom):
    items = shapes_items("shapes-pope", n=2, seed=7)
    res = run_sweep(adapter, items, Sweep(methods=("mi", boom), param="budget", values=(8, 16), max_new_tokens=2))
    assert [(m, why, n) for m, why, n in res.failures] == [(boom, "'boom_test' failed: RuntimeError: boom", 2 * len(items))]
    mi = [r for r in res.records if r["method"] == "mi"]
    assert len(mi) == 2 * len(items) and all(r.get("error") is None and r["prediction"] is not None for r in mi)
    assert all(r["error"] for r in res.records if r["method"] == boom)


def test_the_engine_gives_the_broken_method_its_own_panel_and_answer(adapter, boom):
    engine = ModelService(adapter)
    session = engine.new_session()
    key = engine.encode(session, IMAGE, "what color is the triangle?")
    views = engine.view(session, key, ["mi", boom, "random"], 16)
    assert [v.method for v in views] == ["mi", boom, "random"]
    assert views[1].error == "'boom_test' failed: RuntimeError: boom" and views[1].selection is None
    for v in (views[0], views[2]):
        assert v.error is None and v.kept == 16 and v.mask is not None and v.heatmap is not None
    ref, mi, bad = engine.generate_many(session, key, ["mi", boom], 16, max_new_tokens=2)
    assert bad == "'boom_test' failed: RuntimeError: boom"
    assert isinstance(ref, mipruner.models.base.Answer) and isinstance(mi, mipruner.models.base.Answer)
    assert mi.token_ids == mipruner.answer(adapter, engine.encoded(session, key),
                                           mipruner.select(adapter, engine.encoded(session, key), "mi", 16),
                                           max_new_tokens=2).token_ids
    with pytest.raises(ValueError, match="budget"):  # a bad budget is still the request's error
        engine.view(session, key, ["mi", boom], 10_000)
    assert torch.is_tensor(views[0].selection.keep)
