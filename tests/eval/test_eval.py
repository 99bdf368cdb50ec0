"""Evaluation metrics, the POPE reader and the method x budget runner (on the dummy adapter)."""
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mipruner.eval.metrics import answer_matches, parse_yes_no, pope_metrics, query_recall, token_object_cover
from mipruner.eval.runner import evaluate
from mipruner.eval.tasks import EvalItem, read_pope
from mipruner.models.base import TokenGeometry
from mipruner.models.common.dummy import DummyAdapter


def test_pope_metrics_by_hand():
    # 3 yes-labels, 2 no-labels; predictions: TP=2, FN=1 (answered "maybe" -> no), FP=1, TN=1.
    m = pope_metrics(["Yes, there is.", "yes", "maybe", "yes", "No."], ["yes", "yes", "yes", "no", "no"])
    assert m["acc"] == pytest.approx(3 / 5)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3) and m["yes_rate"] == pytest.approx(3 / 5)


def test_answer_parsing():
    assert parse_yes_no("I think no.") == "no" and parse_yes_no("Nope") == ""
    assert answer_matches("Two", "2") and answer_matches("red.", "Red") and not answer_matches("", "")


def grid_geometry(gh, gw, p):
    rr, cc = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    rr, cc = rr.flatten(), cc.flatten()
    box = torch.stack([cc * p, rr * p, (cc + 1) * p, (rr + 1) * p], 1).float()
    return TokenGeometry(frame=torch.zeros_like(rr), row=rr, col=cc, box=box, kind=["patch"] * len(rr),
                         grids=[(gh, gw)], sizes=[(gw * p, gh * p)])


def test_cover_and_query_recall():
    geo = grid_geometry(4, 4, 10)  # 40 x 40 image, 16 tokens
    mask = np.zeros((40, 40), bool)
    mask[0:20, 0:15] = True  # token (0,0),(1,0) fully; (0,1),(1,1) half covered
    cover = token_object_cover(geo, [mask])
    assert cover[0].item() == 1.0 and cover[4].item() == 1.0
    assert cover[1].item() == pytest.approx(0.5) and cover[2].item() == 0.0
    assert query_recall(torch.tensor([0, 1, 9]), cover) == pytest.approx(2 / 4)
    assert query_recall(torch.tensor([0, 1, 9]), cover, min_cover=0.9) == pytest.approx(1 / 2)
    assert math.isnan(query_recall(torch.tensor([0]), torch.zeros(16)))
    # one definition of "object token" for every recall figure: the scenes' PATCH_MIN_COVER (0.2)
    from mipruner.shapes.scenes import PATCH_MIN_COVER, patch_coverage

    thin = np.zeros((40, 40), bool)
    thin[0:10, 0:3] = True  # 30 % of token (0,0)
    thin[10:20, 0:2] = True  # 20 % of token (1,0)
    thin[20:30, 0:1] = True  # 10 % of token (2,0)
    c = token_object_cover(geo, [thin])
    grid = torch.from_numpy(patch_coverage(thin, 4, 4)).float()
    assert torch.equal((c >= PATCH_MIN_COVER), (grid >= PATCH_MIN_COVER))
    assert query_recall(torch.tensor([4]), c) == pytest.approx(1 / 2)  # tokens 0 and 4 count, 8 does not


def test_read_pope(tmp_path):
    rows = [{"question_id": i, "image": f"im{i}.jpg", "text": f"Is there a cat {i}?", "label": "yes" if i % 2 else "no"}
            for i in range(5)]
    f = tmp_path / "coco_pope_adversarial.json"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    items = read_pope([str(f)], str(tmp_path), n=3)
    assert [it.split for it in items] == ["adversarial"] * 3 and items[1].answer == "yes"
    assert items[0].media == str(tmp_path / "im0.jpg")
    bad = tmp_path / "x_random.json"
    bad.write_text(json.dumps({"question_id": 1}) + "\n")
    with pytest.raises(ValueError, match="lacks"):
        read_pope([str(bad)], str(tmp_path))


def scene(bright: bool):
    a = np.full((32, 32, 3), 40, np.uint8)
    mask = np.zeros((32, 32), bool)
    if bright:
        a[8:16, 16:24] = 255
        mask[8:16, 16:24] = True
    return Image.fromarray(a), mask


def test_runner_rows_on_dummy_adapter():
    items = []
    for i in range(4):
        im, mask = scene(bright=i % 2 == 0)
        items.append(EvalItem(id=str(i), media=im, question="Is there a white square?", kind="yesno",
                              answer="yes" if i % 2 == 0 else "no", split="random" if i < 2 else "popular",
                              masks=[mask]))
    rows = evaluate(DummyAdapter(patch=8), items, ["none", "mi", "random"], [1, 16], {"lam": 1.0}, "toy")
    get = {(r["method"], r["budget"], r["split"]): r for r in rows}
    # Unpruned and keep-all answers are right; MI keeps the one white token even at budget 1.
    assert get[("none", "all", "average")]["acc"] == 1.0
    assert get[("mi", 1, "average")]["acc"] == 1.0 and get[("mi", 1, "random")]["query_recall"] == 1.0
    assert get[("mi", 16, "average")]["acc"] == 1.0
    # Random with 1 of 16 tokens rarely hits the white token: yes-rate drops below the truth.
    assert get[("random", 1, "average")]["yes_rate"] < 0.5
    assert {r["split"] for r in rows} == {"random", "popular", "average"}
    assert all(r["n"] == 2 for r in rows if r["split"] != "average")


def test_dummy_attention_feeds_every_attention_pruner():
    import mipruner
    from mipruner.pruners import get_pruner

    enc = DummyAdapter(patch=8).encode(scene(True)[0], "Is there a white square?", need_attention=True)
    assert enc.attention.shape == (enc.n_visual + 1,) * 2 and enc.keys.shape[0] == enc.n_visual + 1
    for name in mipruner.list_pruners():
        if get_pruner(name).needs_attention and not get_pruner(name).video:  # video ones: a clip (tests/models)
            sel = mipruner.prune(name, visual=enc.visual, text=enc.scoring_text, budget=4,
                                 attention=enc.attention, keys=enc.keys)
            assert sel.budget == 4


def test_n_is_exact_on_open_tasks_and_whole_scenes_per_pope_split():
    """`--n` as docs/evaluation.md states it: exactly N items on shapes-open, at least N per POPE split
    (whole scenes, each scene's positives with its negatives), and every split balanced."""
    from collections import Counter

    from mipruner.eval.shapes import shapes_items

    assert len(shapes_items("shapes-open", n=3)) == 3
    pope = shapes_items("shapes-pope", n=3)
    per_split = Counter(it.split for it in pope)
    assert set(per_split) == {"random", "popular", "adversarial"} and all(v >= 3 for v in per_split.values())
    for split in per_split:
        answers = Counter(it.answer for it in pope if it.split == split)
        assert answers["yes"] == answers["no"]


def test_runner_selects_a_group_of_items_as_one_batched_call(monkeypatch):
    """encode_batch=4: each (method, budget, seed) selects the group's four encodings in one batched call where the
    method allows it (`select_batch`); the rows equal those of items selected one by one (encode_batch=1)."""
    from mipruner.pruners import batched

    items = []
    for i in range(4):
        im, mask = scene(bright=i % 2 == 0)
        items.append(EvalItem(id=str(i), media=im, question="Is there a white square?", kind="yesno",
                              answer="yes" if i % 2 == 0 else "no", split="random", masks=[mask]))
    methods = ["none", "mi", "similarity", "random", "pool", "cdpruner"]
    one = evaluate(DummyAdapter(patch=8), items, methods, [1, 5], {"lam": 1.0}, "toy", encode_batch=1)
    calls = []
    real = batched._stacked
    monkeypatch.setattr(batched, "_stacked", lambda spec: (calls.append(spec.name), real(spec))[1])
    grouped = evaluate(DummyAdapter(patch=8), items, methods, [1, 5], {"lam": 1.0}, "toy", encode_batch=4)
    # one call per (method, budget, seed) of the methods that batch; cdpruner and pool declare no batched call
    assert sorted(set(calls)) == ["mi", "random", "similarity"]
    assert len(calls) == 2 * (1 + 1 + 3)
    key = lambda r: (r["method"], str(r["budget"]), r["split"])  # noqa: E731
    assert len(one) == len(grouped)
    for a, b in zip(sorted(one, key=key), sorted(grouped, key=key)):
        assert a.keys() == b.keys()
        for k in a:
            same = a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))
            assert same, (key(a), k, a[k], b[k])


def test_select_batch_gives_every_pre_llm_methods_one_by_one_selections(monkeypatch):
    import mipruner
    from mipruner.pruners import batched, get_pruner

    ad = DummyAdapter(patch=8)
    encs = [ad.encode(scene(bright=i % 2 == 0)[0], "Is there a white square?", need_attention=True) for i in range(3)]
    calls = []
    real = batched._stacked
    monkeypatch.setattr(batched, "_stacked", lambda spec: (calls.append(spec.name), real(spec))[1])
    for m in mipruner.list_pruners("projector") + mipruner.list_pruners("vision"):
        if get_pruner(m).video:  # images: a video method does not apply (tests/models/test_evs_video.py)
            continue
        calls.clear()
        if get_pruner(m).video:  # on images a video method gives its sentence (on clips: tests/models)
            with pytest.raises(ValueError, match="1 frame"):
                mipruner.select_batch(ad, encs, m, 5, caches=[{}, {}, {}])
            continue
        got = mipruner.select_batch(ad, encs, m, 5, caches=[{}, {}, {}])
        ref = [mipruner.select(ad, e, m, 5) for e in encs]
        assert calls == ([m] if get_pruner(m).capture.batch else []), m
        for a, b in zip(got, ref):  # decisions exact (the scores: tests/pruners/test_capture.py)
            assert torch.equal(a.keep, b.keep) and torch.equal(a.order, b.order), m
            assert a.method == b.method == m and a.extras.keys() == b.extras.keys()
            assert a.extras.get("lam_note") == b.extras.get("lam_note")
            assert a.extras.get("compute") == b.extras.get("compute"), m  # the compute a selection implies, as select's
    with pytest.raises(ValueError, match="caches has 1 entries for 3 encodings"):
        mipruner.select_batch(ad, encs, "mi", 5, caches=[{}])
