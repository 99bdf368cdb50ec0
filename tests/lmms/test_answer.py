"""mipruner.lmms without lmms-eval's runner: settings checks, one-item answers = the eval runner's, scoring."""
import pytest

import mipruner
from mipruner.inllm import _run as inllm_run
from mipruner.eval.metrics import average_splits, open_metrics, pope_metrics
from mipruner.eval.runner import RANDOM_SEEDS, evaluate
from mipruner.eval.shapes import shapes_items
from mipruner.lmms import TASKS_DIR, tasks
from mipruner.lmms.answer import MethodConfig, answer, parse_budget
from mipruner.lmms.make_tasks import write_pope_yamls


def test_settings_are_checked_with_plain_errors():
    c = MethodConfig.parse("mi", 64, lam=1, tau=0.1)
    assert c.params == {"lam": 1.0, "tau": 0.1} and isinstance(c.params["lam"], float) and c.text_mode == "question"
    assert MethodConfig.parse("fastv", "25%", layer=2).budget == 0.25
    assert parse_budget(0.5) == 0.5 and parse_budget("128") == 128 and parse_budget("0.25") == 0.25
    with pytest.raises(ValueError, match="Did you mean 'mi'"):
        MethodConfig.parse("mii", 64)
    with pytest.raises(ValueError, match="has no setting.*lamda.*its settings: aggregation, lam"):
        MethodConfig.parse("mi", 64, lamda=1)
    with pytest.raises(ValueError, match="needs a budget"):
        MethodConfig.parse("random")
    with pytest.raises(ValueError, match="drop budget"):
        MethodConfig.parse("none", 64)
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\]"):
        MethodConfig.parse("mi", 1.5)
    with pytest.raises(ValueError, match=">= 1"):
        MethodConfig.parse("mi", 0)
    with pytest.raises(ValueError, match="text_mode"):
        MethodConfig.parse("mi", 8, text_mode="all")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        MethodConfig.parse("mi", 8, aggregation=3)
    with pytest.raises(ValueError, match="attention"):  # filled from the encoding, never a setting
        MethodConfig.parse("visionzip", 8, attention=1)


def _spy(monkeypatch, adapter):
    """Record every answer text the runner (or `answer`) produces, in call order."""
    texts = []
    gen, igen = adapter.generate, inllm_run.generate

    def generate(*a, **k):
        out = gen(*a, **k)
        texts.append(out.text)
        return out

    def igenerate(*a, **k):
        out = igen(*a, **k)
        texts.append(out.text)
        return out

    monkeypatch.setattr(adapter, "generate", generate)
    monkeypatch.setattr(inllm_run, "generate", igenerate)  # in-LLM answers end there
    return texts


def test_one_item_answer_is_the_eval_runners(monkeypatch):
    """`answer` (the lmms model's only path) gives the runner's answer for every kind of method."""
    adapter = mipruner.load("shapes-llava", device="cpu")
    items = shapes_items("shapes-pope", n=3)[:1] + shapes_items("shapes-open", n=1)
    methods = ["mi", "random", "similarity", "visionzip", "fastv", "dart"]
    budgets = [12, 0.25]
    params = {"lam": 1.0, "layer": 1}
    texts = _spy(monkeypatch, adapter)
    evaluate(adapter, items, ["none"] + methods, budgets, params, "mixed", text_mode="nostop", batch=False)
    got = []
    for item in items:
        runs = [("none", None, None)] + [(m, b, s) for m in methods for b in budgets
                                         for s in (RANDOM_SEEDS if m == "random" else (None,))]
        for m, b, s in runs:
            kw = {k: v for k, v in params.items() if m != "none" and k in
                  mipruner.get_pruner(m).param_names}
            if s is not None:
                kw["seed"] = s
            got.append((item.id, m, b, s, answer(adapter, item.media, item.question,
                                                 MethodConfig.parse(m, b, "nostop", **kw), 8).text))
    runner = texts[: len(got)]
    assert len(texts) == 2 * len(got)  # the runner's answers, then ours (each through the spied calls)
    assert [g[-1] for g in got] == runner
    assert len({g[-1] for g in got}) > 1  # not one constant answer


def test_task_scoring_is_the_shared_metrics():
    preds = ["Yes", "no", "yes, there is", "maybe", "no"]  # "maybe" counts as no
    labels = ["yes", "yes", "yes", "no", "no"]
    recs = [tasks.pope_process_results({"answer": lab}, [p])["acc"] for p, lab in zip(preds, labels)]
    m = pope_metrics(preds, labels)
    assert tasks.pope_acc(recs) == m["acc"] == pytest.approx(0.8)
    assert tasks.pope_f1(recs) == m["f1"] == pytest.approx(0.8)
    assert tasks.pope_precision(recs) == 1.0 and tasks.pope_recall(recs) == pytest.approx(2 / 3)
    # the PREDICTED yes-rate (2 of 5 answers), not the labels' yes share (3 of 5)
    assert tasks.pope_yes_rate(recs) == m["yes_rate"] == pytest.approx(0.4)
    recs = [tasks.open_process_results({"answer": a}, [p])["acc"] for p, a in [("Two.", "two"), ("red", "blue")]]
    assert tasks.open_acc(recs) == open_metrics(["Two.", "red"], ["two", "blue"])["acc"] == 0.5
    avg = average_splits([{"acc": 1.0, "f1": float("nan")}, {"acc": 0.5, "f1": 0.2}])
    assert avg["acc"] == 0.75 and avg["f1"] == 0.2


def test_shipped_pope_yamls_are_the_generated_ones(tmp_path):
    names = write_pope_yamls(str(tmp_path))
    for name in names + ["mipruner_pope"]:
        with open(f"{TASKS_DIR}/{name}.yaml") as a, open(tmp_path / f"{name}.yaml") as b:
            assert a.read() == b.read(), f"{name}.yaml differs: rerun python -m mipruner.lmms.make_tasks --pope-yamls"


def test_sweep_expansion_and_config_merge(tmp_path, monkeypatch):
    import json
    import os

    import yaml

    from mipruner.lmms.__main__ import _config_with_tasks_dir, expand_model_args
    from mipruner.lmms.model import SWEEP_ENV

    runs = expand_model_args("pretrained=m,method=none|mi|random,budget=16|25%,lam=1,cache_dir=/c")
    assert runs == [("none", "pretrained=m,method=none,cache_dir=/c"),
                    ("mi_16", "pretrained=m,method=mi,budget=16,lam=1,cache_dir=/c"),
                    ("mi_25pct", "pretrained=m,method=mi,budget=25%,lam=1,cache_dir=/c"),
                    ("random_16", "pretrained=m,method=random,budget=16,cache_dir=/c"),
                    ("random_25pct", "pretrained=m,method=random,budget=25%,cache_dir=/c")]
    assert expand_model_args("method=mi,budget=8,lam=0.5|1") == [("mi_8_lam0.5", "method=mi,budget=8,lam=0.5"),
                                                                 ("mi_8_lam1", "method=mi,budget=8,lam=1")]
    assert expand_model_args("method=mi,budget=8,lamda=1") == [("mi_8", "method=mi,budget=8,lamda=1")]  # -> model error
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump([{"model": "mipruner", "model_args": "method=mi,budget=8", "include_path": "/x"},
                                   {"model": "mipruner", "model_args": "method=random,budget=8"}]))
    monkeypatch.setenv(SWEEP_ENV, "")  # restored after the test
    with open(_config_with_tasks_dir(str(cfg))) as f:
        merged = yaml.safe_load(f)
    assert [r["include_path"] for r in merged] == [["/x", TASKS_DIR], [TASKS_DIR]]
    assert json.loads(os.environ[SWEEP_ENV]) == ["method=mi,budget=8", "method=random,budget=8"]


def test_the_answer_cache_and_the_app_key_the_same_media_alike(tmp_path):
    """One media hasher: lmms-eval's visuals for a document and the same media given to the app's engine get
    the same content key (a path and the image it holds differ from each other, in both alike)."""
    import numpy as np
    from PIL import Image

    from mipruner.serve.service import ModelService
    from mipruner.lmms.model import media_key
    from mipruner.media import Video
    from mipruner.models.common.dummy import DummyAdapter

    rng = np.random.default_rng(0)
    pics = [Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)) for _ in range(2)]
    path = tmp_path / "a.png"
    pics[0].save(path)
    engine = ModelService(DummyAdapter())
    s = engine.new_session()
    app = {name: engine.encode(s, media, "what is this?").media
           for name, media in (("image", pics[0]), ("images", pics), ("path", str(path)))}
    assert app == {"image": media_key([pics[0]]), "images": media_key(pics), "path": media_key(str(path))}
    assert len(set(app.values())) == 3
    video = Video(frames=pics, indices=[0, 5], fps=2.0, total_frames=10)
    assert media_key([video]) == mipruner.media.media_hash(video) != media_key(pics)
