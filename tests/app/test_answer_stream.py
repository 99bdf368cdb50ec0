"""The page's answers as they come (issue 46, section 6; components.core.answers, Handlers.stream): on a CPU
the pruned answers first and the unpruned reference last, each one's text reported while it decodes, the
answers the same as a plain call's (the watching logits processor leaves the scores as they are), each
answer's time its own, and two sessions' streams kept apart. Also the encode's progress while it runs."""
from __future__ import annotations

import contextlib
import threading
import time

import pytest

from components.core import answers as A
from components.core.examples import load_examples
from components.core.logic import AppLogic, UserError
from components.core.settings import Settings
from components.page.handlers import Handlers, Media, controls_for, waiting

IMAGES = [e for e in load_examples() if e["kind"] == "image"][:2]
SETTINGS = Settings(methods=("mi", "random", "fastv"), budget=0.25)  # fastv answers inside the LLM: no hook
NEW = 6
PROMPT = "what is in the image?"


@pytest.fixture(scope="module")
def handlers(hub):
    return Handlers(AppLogic(hub, max_new_tokens=NEW), auto_answers=True)


def encode(handlers, example):
    return handlers.encode(None, Media(model="shapes-llava", image=example["path"], prompt=example["prompt"]),
                           controls_for(SETTINGS)).state


def final(rec) -> dict:
    done = {m: rec.methods[m] for m in rec.methods}
    done[None] = rec.reference
    return {m: (a["text"], a["new_tokens"], a["input_tokens"]) for m, a in done.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny random-weight OneVision: its answers run to max_new_tokens (several tokens to watch)."""
    import torch

    from mipruner.bench.zoo import picture
    from mipruner.serve.service import ModelService
    from mipruner.models.onevision.random_weights import build

    engine = ModelService(build(tiny=True, device="cpu", dtype=torch.float32, shape="0.5B")[0], name="tiny-onevision")
    path = str(tmp_path_factory.mktemp("tiny") / "photo.png")
    picture(64, 48).save(path)
    session = engine.new_session()
    return engine, session, engine.encode(session, path, PROMPT, need_attention=True), path


def test_pruned_answers_come_first_each_reported_as_it_decodes(tiny, monkeypatch):
    monkeypatch.setattr(A.TokensSoFar.__init__, "__defaults__", (0.0,))  # a report at every step
    engine, session, key, path = tiny
    methods = list(SETTINGS.methods)
    finished, partial, t0, last = [], {}, time.perf_counter(), None
    for rec in A.stream(engine, session, key, methods, 0.25, SETTINGS.params, NEW, guard=contextlib.nullcontext):
        finished += [m for m in [*rec.methods, *([None] if rec.reference else [])] if m not in finished]
        for m, text in rec.partial.items():
            partial.setdefault(m, []).append(text)
        last = rec
    wall = time.perf_counter() - t0
    assert finished == ["mi", "random", "fastv", None]  # the panels' order, the unpruned reference last
    other = engine.new_session()  # the same answers from plain calls (no logits processor) in a session of their own
    key2 = engine.encode(other, path, PROMPT, need_attention=True)
    plain = {m: engine.generate(other, key2, m, 0.25, SETTINGS.params, max_new_tokens=NEW) for m in A.order(methods)}
    assert final(last) == {m: (a.text, len(a.token_ids), a.input_tokens) for m, a in plain.items()}
    assert not last.partial  # nothing left half-way
    assert all(a["new_tokens"] == NEW for a in [*last.methods.values(), last.reference])  # random weights: no EOS
    assert set(partial) <= {"mi", "random", None}  # fastv decodes in its own loop (inside the LLM): it comes whole
    for m, texts in partial.items():  # the text so far (reports that come together are drawn once): the answer's start
        text = last.reference["text"] if m is None else last.methods[m]["text"]
        assert all(text.startswith(t) for t in texts), (m, texts, text)
    spent = sum((a["prefill_ms"] + a["decode_ms"]) / 1e3 for a in [*last.methods.values(), last.reference])
    assert spent <= wall  # each answer's time is its own (a batch's time shown on every answer would add up past it)


def test_the_watch_reports_every_token_so_far_and_leaves_the_answer_as_it_is(tiny):
    engine, _, _, path = tiny
    session = engine.new_session()
    key = engine.encode(session, path, PROMPT, need_attention=True)
    reports, stop = [], threading.Event()
    watch = A.TokensSoFar(reports.append, stop, every=0.0)
    ans = engine.generate(session, key, "mi", 0.25, SETTINGS.params, max_new_tokens=NEW, logits_processor=[watch])
    assert reports == [ans.token_ids[:n] for n in range(1, NEW)]  # before each step's pick: the tokens so far
    session2 = engine.new_session()
    key2 = engine.encode(session2, path, PROMPT, need_attention=True)
    stop.set()  # the reader went away: the decoding stops at its next step
    with pytest.raises(A.Stopped):
        engine.generate(session2, key2, "mi", 0.25, SETTINGS.params, max_new_tokens=NEW, logits_processor=[watch])


def test_the_page_handler_streams_answers_into_the_panels(handlers):
    st = encode(handlers, IMAGES[1])
    outs = list(handlers.stream(st, controls_for(SETTINGS), NEW, bare=True))
    assert len(outs) >= len(A.order(SETTINGS.methods))  # one update at least per answer
    assert outs[0].answers["reference"] is None and outs[-1].answers["reference"] is not None
    assert all(p.startswith("**Answer:**") for p in outs[-1].panels[:3])
    assert outs[-1].reference.startswith("**Unpruned reference answer:**")
    with pytest.raises(UserError, match="run the model first"):
        list(handlers.stream(None, controls_for(SETTINGS), NEW))


def test_two_sessions_streaming_at_once_see_their_own_answers(handlers):
    a, b = encode(handlers, IMAGES[0]), encode(handlers, IMAGES[1])
    sa = handlers.logic.stream_answers(a, SETTINGS.replace(budget=0.5), NEW)
    sb = handlers.logic.stream_answers(b, SETTINGS.replace(budget=0.5), NEW)
    last = {}
    while sa or sb:  # read the two streams in turns, both decoding meanwhile
        for name, s in (("a", sa), ("b", sb)):
            if s is None:
                continue
            rec = next(s, None)
            if rec is None:
                sa, sb = (None, sb) if name == "a" else (sa, None)
            else:
                last[name] = rec
    engine = handlers.logic.hub.get("shapes-llava")[0]
    for name, st in (("a", a), ("b", b)):
        own = {m: engine.cached_answer(st.session, st.key, m, 0.5, SETTINGS.params, max_new_tokens=NEW)
               for m in A.order(SETTINGS.methods)}
        assert final(last[name]) == {m: (x.text, len(x.token_ids), x.input_tokens) for m, x in own.items()}
    assert last["a"].reference["input_tokens"] == last["b"].reference["input_tokens"]  # same sizes, own answers


def test_the_encode_reports_its_progress_while_it_runs():
    told, started = [], threading.Event()

    def progress(share, desc):
        told.append((share, desc))
        started.set()

    def slow():  # returns once it has been reported on: no timing in the test
        assert started.wait(30)
        return "encoded"

    assert waiting(slow, progress, "encoding", None, every=0.01) == "encoded"
    assert told[0][0] is None and told[0][1].startswith("encoding: ")
    told.clear()
    started.clear()
    assert waiting(slow, progress, "encoding", 40.0, every=0.01) == "encoded"
    assert 0 <= told[0][0] < 1 and "(the last one here took 40 s)" in told[0][1]
    with pytest.raises(UserError, match="bad"):
        waiting(lambda: (_ for _ in ()).throw(UserError("bad")), progress, "encoding", None, every=0.01)
    assert waiting(lambda: 3, None, "encoding", None) == 3  # no progress: in this thread


def test_the_app_wraps_its_handlers_only_on_zero_gpu(monkeypatch):
    """app.py passes ZeroGPU's wrapper to AppLogic on a ZeroGPU Space only: elsewhere None, so a CPU app streams its
    answers (AppLogic.streams reads `gpu is None`); before, the wrapper was passed everywhere and streams was False."""
    import app
    import components.hosting.spaces_gpu as zero

    monkeypatch.setattr(zero, "on_zero_gpu", lambda: False)
    assert app.handler_wrapper() is None
    monkeypatch.setattr(zero, "on_zero_gpu", lambda: True)
    assert app.handler_wrapper() is zero.gpu
