"""The sweep runner on the dummy adapter: one encoding per item (per text mode), the rows it makes,
cancelling, the files it writes, the question sets and the headless command."""
from __future__ import annotations

import csv
import json
import math
import zipfile

import numpy as np
import pytest
from PIL import Image

from mipruner.eval.sweep import Sweep, SweepResult, parse_values, run_sweep, sweepable
from mipruner.eval.sweep.sets import generated_set, user_set
from mipruner.eval.tasks import EvalItem
from mipruner.models.common.dummy import DummyAdapter


class CountingAdapter(DummyAdapter):
    """The dummy model, counting encodes and answers; optionally interrupted at the n-th encode."""

    def __init__(self, interrupt_at: int | None = None):
        super().__init__(patch=8)
        self.encodes, self.generates, self.answered, self.interrupt_at = [], 0, [], interrupt_at
        self.alive = []  # every media and encoding seen, kept alive: their id()s stay distinct (no reuse)

    def encode(self, media, prompt, *, text_mode="question", need_attention=False):
        if self.interrupt_at is not None and len(self.encodes) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.alive.append(media)
        self.encodes.append((id(media), text_mode))
        return super().encode(media, prompt, text_mode=text_mode, need_attention=need_attention)

    def generate(self, encoded, keep=None, **kw):
        self.generates += 1
        self.alive.append(encoded)
        self.answered.append((id(encoded), None if keep is None else tuple(keep.keep.tolist())))
        return super().generate(encoded, keep=keep, **kw)


def scene(bright: bool):
    a = np.full((32, 32, 3), 40, np.uint8)
    mask = np.zeros((32, 32), bool)
    if bright:
        a[8:16, 16:24] = 255
        mask[8:16, 16:24] = True
    return Image.fromarray(a), mask


def items(n: int = 4) -> list[EvalItem]:
    out = []
    for i in range(n):
        im, mask = scene(bright=i % 2 == 0)
        out.append(EvalItem(id=str(i), media=im, question="Is there a white square?", kind="yesno",
                            answer="yes" if i % 2 == 0 else "no", split="random" if i < n // 2 else "popular",
                            masks=[mask]))
    return out


def rows_of(res, method, split=None):
    split = split or res.overall
    return {r["value"]: r for r in res.rows if r["method"] == method and r["split"] == split}


def test_each_item_is_encoded_once_for_every_method_and_value():
    ad = CountingAdapter()
    sw = Sweep(methods=("mi", "random", "similarity"), param="budget", values=(1, 2, 4, 16))
    res = run_sweep(ad, items(4), sw)
    assert len(ad.encodes) == 4 == res.n_encodes == res.n_items
    assert len({m for m, _ in ad.encodes}) == 4  # one per item, never twice
    # answers: 1 unpruned + (mi + similarity + random x 3 seeds) x 4 budgets per item ...
    assert len(res.records) == 4 * (1 + (1 + 1 + 3) * 4)
    # ... of which the LLM computed each distinct kept set of an encoding once (budget 16 keeps all 16
    # tokens for every method and seed: one call per item, the unpruned answer's keep=None aside)
    assert ad.generates == res.n_llm_calls == len(set(ad.answered)) < len(res.records)
    assert sum(k is not None and len(k) == 16 for _, k in ad.answered) == 4
    mi = rows_of(res, "mi")
    assert list(mi) == [1, 2, 4, 16] and all(r["varies"] for r in mi.values())
    assert [mi[b]["kept"] for b in (1, 2, 4, 16)] == [1, 2, 4, 16]
    # MI keeps the white token even at budget 1 (lam auto = 1: a yes/no question): every answer right
    assert mi[1]["acc"] == 1.0 and mi[1]["query_recall"] == 1.0 and mi[1]["lam"] == 1.0
    assert rows_of(res, "none")[None]["acc"] == 1.0
    # Random with 1 of 16 tokens rarely keeps the white one: it answers "no" too often
    assert rows_of(res, "random")[1]["yes_rate"] < 0.5
    # the rows agree with the per-item records they summarise
    recs = [r for r in res.records if r["method"] == "similarity" and r["value"] == 2]
    assert len(recs) == 4 and rows_of(res, "similarity")[2]["acc"] == sum(r["correct"] for r in recs) / 4
    assert {r["split"] for r in res.rows} == {"random", "popular", "average"} and res.overall == "average"


def test_text_mode_sweep_encodes_once_per_mode_and_plain_methods_once():
    ad = CountingAdapter()
    sw = Sweep(methods=("mi", "random"), param="text_mode", values=("question", "prompt"), budget=2)
    res = run_sweep(ad, items(2), sw)
    assert sorted(m for _, m in ad.encodes) == ["prompt", "prompt", "question", "question"]
    assert res.n_encodes == 4
    # random reads no text: run once per item (3 seeds), drawn flat over both values
    rnd = [r for r in res.records if r["method"] == "random"]
    assert len(rnd) == 2 * 3 and {r["value"] for r in rnd} == {"question"}
    flat = rows_of(res, "random")
    assert set(flat) == {"question", "prompt"} and not any(r["varies"] for r in flat.values())
    assert flat["question"]["acc"] == flat["prompt"]["acc"]
    assert all(r["varies"] for r in rows_of(res, "mi").values())


def test_param_sweep_validates_and_fixes_lam_rule():
    sw = Sweep(methods=("mi", "random"), param="lam", values="0, 0.5,1", budget=2)
    assert sw.values == (0.0, 0.5, 1.0) and sw.params == {"lam_rule": "fixed"}
    assert not sw.varies("random") and sw.varies("mi")
    res = run_sweep(CountingAdapter(), items(2), sw)
    assert [r["lam"] for r in res.records if r["method"] == "mi"] == [0.0, 0.5, 1.0] * 2
    assert parse_values("aggregation", "max,mean") == ("max", "mean")
    assert parse_values("budget", "4, 0.5") == (4, 0.5)
    assert parse_values("layer", ["2", 3]) == (2, 3)
    with pytest.raises(ValueError, match="Did you mean 'tau'"):
        Sweep(methods=("mi",), param="tua", values="0.1")
    with pytest.raises(ValueError, match="tau must be in"):
        parse_values("tau", "0.1,0")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        parse_values("aggregation", "max,median")
    with pytest.raises(ValueError, match="duplicate"):
        parse_values("budget", "4,4")
    with pytest.raises(ValueError, match="budget"):
        parse_values("budget", "0")
    with pytest.raises(ValueError, match="takes"):
        Sweep(methods=("random",), param="lam", values="0.5")
    assert Sweep(methods=("random",), param="budget", values="2", seeds="5").seeds == (5,)
    res1 = run_sweep(CountingAdapter(), items(2), Sweep(methods=("random",), param="budget", values="2", seeds=(7,)))
    assert [r["seed"] for r in res1.records if r["method"] == "random"] == [7, 7]
    with pytest.raises(ValueError, match="swept"):
        Sweep(methods=("mi",), param="tau", values="0.1", params={"tau": 0.2})
    assert {"budget", "text_mode", "lam", "tau", "aggregation", "normalization", "layer"} <= set(sweepable())


def test_cancel_between_items_and_mid_item_and_ctrl_c():
    done = []
    res = run_sweep(CountingAdapter(), items(4), Sweep(methods=("mi",), param="budget", values=(1, 2)),
                    progress=lambda d, t: done.append((d, t)), should_stop=lambda: len(done) >= 2)
    assert res.cancelled and res.n_items == 2 and done == [(1, 4), (2, 4)]
    assert {r["item"] for r in res.records} == {"0", "1"}
    calls = []

    def stop_mid_item():  # checks: before item 0, its 2 selections, before item 1, item 1's first selection
        calls.append(1)
        return len(calls) >= 5
    res = run_sweep(CountingAdapter(), items(4), Sweep(methods=("mi",), param="budget", values=(1, 2)),
                    should_stop=stop_mid_item)
    assert res.cancelled and res.n_items == 1 and {r["item"] for r in res.records} == {"0"} and len(calls) == 5
    ad = CountingAdapter(interrupt_at=3)  # Ctrl-C while encoding the third item
    res = run_sweep(ad, items(4), Sweep(methods=("mi",), param="budget", values=(1,)))
    assert res.cancelled and res.n_items == 2 and len(res.records) == 2 * 2


def test_files_csv_json_png(tmp_path):
    res = run_sweep(CountingAdapter(), items(2), Sweep(methods=("mi", "similarity"), param="budget", values=(1, 4)))
    res.to_csv(str(tmp_path / "s.csv"))
    res.to_json(str(tmp_path / "s.json"))
    res.plot(str(tmp_path / "s.png"))
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert len(rows) == len(res.rows) and rows[0].keys() >= {"method", "value", "acc", "f1", "kept", "prefill_ms"}
    doc = json.loads((tmp_path / "s.json").read_text())  # strict JSON: NaN written as null
    assert doc["sweep"]["values"] == [1, 4] and doc["n_encodes"] == 2 and len(doc["records"]) == len(res.records)
    assert doc["sweep"]["seeds"] == [0, 1, 2] and doc["n_llm_calls"] == res.n_llm_calls
    img = Image.open(tmp_path / "s.png")
    assert img.size[0] > 600 and img.size[1] > 300
    back = SweepResult.from_json(str(tmp_path / "s.json"))  # re-plot / re-tabulate without the model
    assert back.table() == res.table() and back.sweep == res.sweep and back.n_llm_calls == res.n_llm_calls
    fig = res.plot(x="kept", metrics=["acc", "kept"])  # kept is the x axis here, not a panel
    assert [a.get_title() for a in fig.axes if a.get_visible()] == ["accuracy"]
    # overlays share the tokens-kept axis: MI at fixed budgets beside mi_adaptive sweeping its ratio
    ad = run_sweep(CountingAdapter(), items(2), Sweep(methods=("mi_adaptive",), param="gain_ratio", values=(0.2, 0.9),
                                                       budget=16, params={"k_rule": "gain"}))
    fig = res.plot(x="kept", metrics=["acc"], others=[ad])
    labels = fig.legends[0].get_texts()
    assert [t.get_text() for t in labels] == ["MI-Pruner", "Similarity",
                                              "MI-Pruner (adaptive K) [k_rule gain]: gain_ratio 0.2..0.9", "unpruned"]
    with pytest.raises(ValueError, match="kept"):
        res.plot(x="value", others=[ad])


def test_generated_sets_have_the_asked_size_and_masks():
    pope = generated_set("pope", n=10, seed=5)
    assert len(pope) == 10 and [sum(it.split == s for it in pope) for s in ("random", "popular", "adversarial")] == [4, 3, 3]
    assert all(it.masks is not None and it.kind == "yesno" for it in pope)
    assert [it.answer for it in pope[:4]] == ["yes", "no", "yes", "no"]  # balanced at any size
    assert {it.split for it in generated_set("pope-adversarial", n=6, seed=5)} == {"adversarial"}
    opened = generated_set("open", n=7, seed=5)
    assert len(opened) == 7 and all(it.kind == "open" for it in opened)
    clips = generated_set("clips", n=3, seed=5)
    assert len(clips) == 3 and all(len(it.media.frames) == 8 for it in clips)
    with pytest.raises(ValueError, match="unknown question set"):
        generated_set("gqa", n=3)


def make_zip(tmp_path, rows, files=("a.png", "sub/b.png"), name="set.zip", with_questions=True):
    p = tmp_path / name
    with zipfile.ZipFile(p, "w") as zf:
        for f in files:
            im, _ = scene(bright=f.startswith("a"))
            path = tmp_path / f.replace("/", "_")
            im.save(path)
            zf.write(path, f)
        if with_questions:
            zf.writestr("questions.jsonl", "\n".join(json.dumps(r) for r in rows))
    return str(p)


def test_user_set_from_a_zip(tmp_path):
    rows = [{"media": "a.png", "question": "Is there a white square?", "answer": "Yes"},
            {"media": "./sub/b.png", "question": "Is there a white square?", "answer": "no", "split": "dark"},
            {"media": "sub/b.png", "question": "What colour is it?", "answer": "grey", "id": "q3"}]
    got = user_set(make_zip(tmp_path, rows), out_dir=str(tmp_path / "x"))
    assert [(it.kind, it.answer, it.split) for it in got] == [("yesno", "yes", "all"), ("yesno", "no", "dark"),
                                                             ("open", "grey", "all")]
    assert got[2].id == "q3" and Image.open(got[1].media).size == (32, 32)
    res = run_sweep(CountingAdapter(), got[:2], Sweep(methods=("mi",), param="budget", values=(1, 16)))
    assert rows_of(res, "mi")[1]["acc"] == 1.0 and math.isnan(rows_of(res, "mi")[1]["query_recall"])
    sep = tmp_path / "q.jsonl"  # the questions beside the zip instead of inside
    sep.write_text(json.dumps(rows[0]) + "\n")
    assert len(user_set(make_zip(tmp_path, [], name="m.zip", with_questions=False), str(sep))) == 1
    with pytest.raises(ValueError, match="not in the zip"):
        user_set(make_zip(tmp_path, [{**rows[0], "media": "c.png"}], name="c.zip"))
    with pytest.raises(ValueError, match="outside the zip"):
        user_set(make_zip(tmp_path, [{**rows[0], "media": "../a.png"}], name="d.zip"))
    with pytest.raises(ValueError, match="lacks"):
        user_set(make_zip(tmp_path, [{"media": "a.png", "question": "?"}], name="e.zip"))
    with pytest.raises(ValueError, match="questions.jsonl"):
        user_set(make_zip(tmp_path, [], name="f.zip", with_questions=False))
    bad = tmp_path / "evil.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../evil.png", b"x")
        zf.writestr("questions.jsonl", json.dumps(rows[0]))
    with pytest.raises(ValueError, match="unsafe path"):
        user_set(str(bad))


def test_headless_command_writes_the_three_files(tmp_path, monkeypatch, capsys):
    import mipruner
    from mipruner.eval.__main__ import main

    monkeypatch.setattr(mipruner, "load", lambda *a, **k: CountingAdapter())
    rows = [{"media": "a.png", "question": "Is there a white square?", "answer": "yes"},
            {"media": "sub/b.png", "question": "Is there a white square?", "answer": "no"}]
    out = tmp_path / "o" / "tau"
    rc = main(["sweep", "--model", "dummy", "--zip", make_zip(tmp_path, rows), "--methods", "mi,random",
               "--param", "tau", "--values", "0.05,0.5", "--budget", "2", "--lam", "1", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    for ext in (".csv", ".json", ".png"):
        assert (tmp_path / "o" / f"tau{ext}").stat().st_size > 0
    doc = json.loads((tmp_path / "o" / "tau.json").read_text())
    assert doc["sweep"]["param"] == "tau" and doc["sweep"]["params"] == {"lam": 1.0} and doc["n_items"] == 2
    assert "2 items (2 encodings)" in capsys.readouterr().out
    assert main(["sweep", "--from-json", str(out) + ".json", "--x", "kept", "--out", str(tmp_path / "re")]) == 0
    assert (tmp_path / "re.png").stat().st_size > 0 and "tau" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="tau must be in"):
        main(["sweep", "--zip", make_zip(tmp_path, rows, name="g.zip"), "--param", "tau", "--values", "0"])
