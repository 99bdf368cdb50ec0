"""Each answer's own time in the app: a batched view's answers show their share of the batch's prefill."""
from __future__ import annotations

import pytest

from components.core.examples import load_examples
from components.core.logic import AppLogic
from components.core.settings import Settings
from components.page.panels import answer_md, reference_md
from mipruner.serve.answer_time import own_timing, row_prefill_flops


@pytest.fixture(scope="module")
def logic(hub):
    return AppLogic(hub, max_new_tokens=4)


def test_video_panels_show_their_own_share_of_the_prefill(logic):
    clip = next(e for e in load_examples() if e["kind"] == "video")
    st, _ = logic.encode(None, "shapes-llava", "video", None, clip["path"], clip["prompt"])
    out = logic.generate(st, Settings(methods=("mi", "random"), budget=0.1), 4)
    ref, mi, rnd = out["reference"], out["methods"]["mi"], out["methods"]["random"]
    assert ref["input_tokens"] != mi["input_tokens"]
    # the three rows shared one packed prefill: none shows the batch's time as its own
    assert ref["prefill_ms"] != mi["prefill_ms"] and ref["prefill_ms"] != rnd["prefill_ms"]
    for a in (ref, mi, rnd):
        assert a["prefill_label"] == "share of a 3-answer batch's prefill, by compute"
        assert a["batch_prefill_ms"] == ref["batch_prefill_ms"]
    assert ref["prefill_ms"] > mi["prefill_ms"]  # 1,568 visual tokens against 157
    shares = sum(a["prefill_ms"] for a in (ref, mi, rnd))
    assert shares == pytest.approx(ref["batch_prefill_ms"], abs=0.03)  # each rounded to 0.01 ms
    assert "share of a 3-answer batch's prefill, by compute" in answer_md(mi, "")
    assert "share of a 3-answer batch's prefill, by compute" in reference_md(ref)


def test_the_share_follows_the_rows_compute(hub):
    adapter = hub.get(None)[0].adapter
    from mipruner.models.base import Answer
    from mipruner.serve.answer_time import split_batch

    answers = [Answer("", [1], n, 0, 0.3, 0.1) for n in (1579, 168, 168)]
    split_batch(adapter, answers)
    f = [row_prefill_flops(adapter.config, n) for n in (1579, 168, 168)]
    for a, x in zip(answers, f):
        assert a.batch_rows == 3 and a.prefill_share == pytest.approx(x / sum(f), rel=1e-12)
    t = own_timing(answers[0])
    assert t["prefill_ms"] == pytest.approx(300 * f[0] / sum(f)) and t["batch_prefill_ms"] == pytest.approx(300)
    alone = own_timing(Answer("", [1], 10, 0, 0.3, 0.1))
    assert alone["prefill_ms"] == pytest.approx(300) and alone["prefill_label"] == ""
