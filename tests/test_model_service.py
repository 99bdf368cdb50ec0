"""ModelService and sessions: encode once per key, LRU + expiry, isolation between sessions, settings
strings, answer caching, JSON export; one end-to-end run on a tiny real LLaVA."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.serve.service import ModelService, Panel
from mipruner.serve.export import selection_to_json
from mipruner.serve.session import EncodingKey, StaleKeyError, media_hash
from mipruner.models.common.dummy import DummyAdapter

PROMPT = "Is there a white square?"


class CountingAdapter(DummyAdapter):
    """The dummy adapter, counting its forward passes."""

    name = "counting-dummy"

    def __init__(self):
        super().__init__(patch=8, dim=16)
        self.encodes, self.generates = 0, 0

    def encode(self, *a, **kw):
        self.encodes += 1
        return super().encode(*a, **kw)

    def generate(self, *a, **kw):
        self.generates += 1
        return super().generate(*a, **kw)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def picture(seed: int, white: tuple[int, int, int, int] | None = None) -> Image.Image:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 90, (32, 48, 3), dtype=np.uint8)  # 4 x 6 grid of 8 px patches
    if white:
        x0, y0, x1, y1 = white
        a[y0:y1, x0:x1] = 255
    return Image.fromarray(a)


@pytest.fixture
def engine():
    return ModelService(CountingAdapter(), clock=FakeClock())


def test_encode_once_across_many_prune_and_view_calls(engine):
    s = engine.new_session()
    img = picture(0, white=(8, 8, 16, 16))
    key = engine.encode(s, img, PROMPT)
    for b in (3, 5, 8, 0.5):
        engine.prune(s, key, "mi", b, lam=0.5)
        views = engine.view(s, key, ["mi", "random", Panel("similarity", label="sim")], b,
                            {"lam": 0.5, "seed": 1}, heat_token=0)
        assert [v.method for v in views] == ["mi", "random", "similarity"] and views[2].label == "sim"
        assert engine.encode(s, picture(0, white=(8, 8, 16, 16)), PROMPT) == key  # same content -> same key
    assert engine.adapter.encodes == 1
    v = views[0]
    n = engine.encoded(s, key).n_visual
    assert v.kept == 12 and v.share == pytest.approx(12 / n) and v.prune_ms >= 0 and v.render_ms >= 0
    assert v.pivot is not None and v.legend and v.heat_title.startswith("PMI with")
    assert views[1].pivot is None and views[1].heat_title == "random scores"
    assert v.mask.size == img.size
    assert "mi" in s.entries[key].mi_cache  # the MI cache filled once and reused


def test_changed_prompt_or_mode_reencodes(engine):
    s = engine.new_session()
    img = picture(0)
    k1 = engine.encode(s, img, PROMPT)
    k2 = engine.encode(s, img, "Is there a bright square?")
    k3 = engine.encode(s, img, PROMPT, text_mode="prompt")
    assert len({k1, k2, k3}) == 3 and engine.adapter.encodes == 3
    assert engine.encoded(s, k2).prompt == "Is there a bright square?"


def test_need_attention_follows_methods(engine):
    s = engine.new_session()
    img = picture(0)
    k = engine.encode(s, img, PROMPT, methods=["mi", "attention"])
    assert k.need_attention and engine.encoded(s, k).attention is not None
    assert engine.encode(s, img, PROMPT, methods=["mi"]) == k  # the attention encoding serves it too
    assert engine.adapter.encodes == 1
    engine.prune(s, k, "attention", 4)
    k_plain = engine.encode(engine.new_session(), img, PROMPT, methods=["random"])
    assert not k_plain.need_attention


def test_attention_method_without_attention_raises(engine):
    s = engine.new_session()
    k = engine.encode(s, picture(0), PROMPT, need_attention=False)
    with pytest.raises(ValueError, match="attention"):
        engine.prune(s, k, "attention", 4)


def test_cache_lru_and_expiry():
    clock = FakeClock()
    eng = ModelService(CountingAdapter(), clock=clock, session_entries=2, session_max_age_s=60)
    s = eng.new_session()
    ka = eng.encode(s, picture(1), PROMPT)
    kb = eng.encode(s, picture(2), PROMPT)
    eng.prune(s, ka, "random", 3)  # touch a: b is now least recently used
    kc = eng.encode(s, picture(3), PROMPT)
    assert s.keys() == [ka, kc]
    with pytest.raises(StaleKeyError):
        eng.prune(s, kb, "random", 3)
    clock.t += 30
    eng.view(s, kc, ["random"], 3)  # keeps c alive
    clock.t += 45  # a idle for 75 s > 60, c for 45 s
    # expiry happens on the next access
    with pytest.raises(StaleKeyError):
        eng.encoded(s, ka)
    assert eng.encoded(s, kc) is not None
    assert s.keys() == [kc]
    n = eng.adapter.encodes
    assert eng.encode(s, picture(1), PROMPT) == ka and eng.adapter.encodes == n + 1  # re-encoded
    with pytest.raises(ValueError):
        ModelService(CountingAdapter(), session_entries=0).new_session()


def test_sessions_are_isolated_under_interleaving(engine):
    s1, s2 = engine.new_session(), engine.new_session()
    k1 = engine.encode(s1, picture(1, white=(0, 0, 8, 8)), PROMPT)
    k2 = engine.encode(s2, picture(2, white=(40, 24, 48, 32)), "Is there a bright corner?")
    assert k1 != k2
    with pytest.raises(StaleKeyError):
        engine.prune(s1, k2, "random", 3)  # a session cannot reach another's encoding
    for b in (2, 4, 6):
        v1 = engine.view(s1, k1, ["mi", "similarity"], b, {"lam": 1.0})
        v2 = engine.view(s2, k2, ["mi", "similarity"], b, {"lam": 1.0})
        e1, e2 = engine.encoded(s1, k1), engine.encoded(s2, k2)
        ref1 = mipruner.prune("mi", visual=e1.visual, text=e1.scoring_text, budget=b, lam=1.0)
        ref2 = mipruner.prune("mi", visual=e2.visual, text=e2.scoring_text, budget=b, lam=1.0)
        assert torch.equal(v1[0].selection.keep, ref1.keep) and torch.equal(v2[0].selection.keep, ref2.keep)
        assert engine.encoded(s1, k1).prompt == PROMPT
    assert 0 in v1[0].selection.keep.tolist() and 23 in v2[0].selection.keep.tolist()  # their white patch
    assert s1.entries[k1].mi_cache is not s2.entries[k2].mi_cache
    assert s1.entries.keys() == {k1} and s2.entries.keys() == {k2}


def test_threads_on_two_sessions():
    eng = ModelService(CountingAdapter())
    errors = []

    def user(seed):
        try:
            s = eng.new_session()
            k = eng.encode(s, picture(seed), PROMPT)
            for b in range(2, 10):
                sel = eng.view(s, k, ["mi"], b, {"lam": 0.5})[0].selection
                e = eng.encoded(s, k)
                ref = mipruner.prune("mi", visual=e.visual, text=e.scoring_text, budget=b, lam=0.5)
                assert torch.equal(sel.keep, ref.keep)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors


def test_generate_is_cached(engine):
    s = engine.new_session()
    k = engine.encode(s, picture(0, white=(8, 8, 16, 16)), PROMPT)
    assert engine.cached_answer(s, k, None, max_new_tokens=4) is None
    ref = engine.generate(s, k, None, max_new_tokens=4)
    assert ref.text == "yes" and ref.visual_tokens == 24
    assert engine.cached_answer(s, k, None, max_new_tokens=4) is ref
    assert engine.cached_answer(s, k, "mi", 3, {"lam": 1.0}, max_new_tokens=4) is None
    assert engine.generate(s, k, None, max_new_tokens=4) is ref
    a = engine.generate(s, k, "mi", 3, {"lam": 1.0, "seed": 5}, max_new_tokens=4)
    assert a.visual_tokens == 3
    # seed is irrelevant to mi: same cache entry; a different budget or lam is a new answer
    assert engine.generate(s, k, "mi", 3, {"lam": 1.0, "seed": 9}, max_new_tokens=4) is a
    assert engine.adapter.generates == 2
    engine.generate(s, k, "mi", 4, {"lam": 1.0}, max_new_tokens=4)
    engine.generate(s, k, "mi", 3, {"lam": 0.5}, max_new_tokens=4)
    engine.generate(s, k, "random", 3, {"seed": 1}, max_new_tokens=4)
    engine.generate(s, k, "random", 3, {"seed": 2}, max_new_tokens=4)
    assert engine.adapter.generates == 6
    assert engine.cached_answer(s, k, "mi", 3, {"lam": 1.0, "seed": 7}, max_new_tokens=4) is a
    assert engine.adapter.generates == 6  # cached_answer never generates


def test_selection_json_and_media_hash(engine, tmp_path):
    s = engine.new_session()
    k = engine.encode(s, picture(0), PROMPT)
    doc = json.loads(engine.export_json(s, k, "mi", 5, lam=0.5))
    enc = engine.encoded(s, k)
    assert doc["method"] == "mi" and len(doc["keep"]) == 5 and len(doc["scores"]) == enc.n_visual
    assert len(doc["pmi"]) == enc.n_visual and len(doc["pmi"][0]) == len(enc.scoring_tokens)
    assert doc["pivot_tokens"][0] in enc.scoring_tokens and len(doc["geometry"]["box"]) == enc.n_visual
    rnd = mipruner.prune("random", visual=enc.visual, budget=3)
    assert "pmi" not in json.loads(selection_to_json(enc, rnd))
    p = tmp_path / "a.png"
    picture(0).save(p)
    assert media_hash(str(p)) == media_hash(p) != media_hash(picture(0))
    assert media_hash([picture(0), picture(1)]) != media_hash([picture(1), picture(0)])
    assert isinstance(k, EncodingKey) and k.model == "counting-dummy"
    with pytest.raises(ValueError, match="unsupported media"):
        media_hash(3)


def test_lazy_loader_called_once():
    calls = []

    def load():
        calls.append(1)
        return CountingAdapter()

    eng = ModelService(load)
    assert not calls
    s = eng.new_session()
    eng.encode(s, picture(0), PROMPT)
    eng.encode(s, picture(1), PROMPT)
    assert len(calls) == 1
    with pytest.raises(ValueError):
        ModelService(42)


def test_tiny_llava_end_to_end(tmp_path):
    from tests.models.tiny_llava import save_tiny, scene

    torch.manual_seed(0)
    path = save_tiny("llava", str(tmp_path / "llava"))
    eng = ModelService(lambda: mipruner.load(path, device="cpu"))
    s = eng.new_session()
    img = scene(56, 56, square=(28, 14, 42, 28))
    with torch.no_grad():
        key = eng.encode(s, img, "What colour is the square?")
        enc = eng.encoded(s, key)
        assert enc.n_visual == 16
        views = eng.view(s, key, ["mi", "random", "similarity"], 4, {"lam": 0.5, "seed": 0}, heat_token=0)
        for v in views:
            assert v.kept == 4 and v.mask.size == img.size and v.heatmap.size == img.size
        assert views[0].pivot is not None and views[0].legend
        full = eng.generate(s, key, None, max_new_tokens=3)
        pruned = eng.generate(s, key, "mi", 4, {"lam": 0.5}, max_new_tokens=3)
    assert full.visual_tokens == 16 and pruned.visual_tokens == 4
    assert pruned.input_tokens == full.input_tokens - 12
    assert isinstance(full.text, str) and isinstance(pruned.text, str)


def test_generate_many_fills_the_answer_cache(engine):
    s = engine.new_session()
    k = engine.encode(s, picture(0, white=(8, 8, 16, 16)), PROMPT)
    first = engine.generate(s, k, "mi", 3, {"lam": 1.0}, max_new_tokens=4)  # cached before: reused
    assert engine.adapter.generates == 1
    methods = ["mi", "random", Panel("similarity", label="sim"), Panel("mi", params={"lam": 0.5})]
    out = engine.generate_many(s, k, methods, 3, {"lam": 1.0, "seed": 2}, max_new_tokens=4)
    assert len(out) == 5 and out[1] is first and out[0].visual_tokens == 24
    assert [a.visual_tokens for a in out[1:]] == [3, 3, 3, 3]
    assert engine.adapter.generates == 5  # reference + 3 new answers (the dummy has no batched decoder)
    assert engine.cached_answer(s, k, None, max_new_tokens=4) is out[0]
    assert engine.generate(s, k, "random", 3, {"seed": 2}, max_new_tokens=4) is out[2]
    assert engine.generate(s, k, "mi", 3, {"lam": 0.5}, max_new_tokens=4) is out[4]
    again = engine.generate_many(s, k, methods, 3, {"lam": 1.0, "seed": 2}, max_new_tokens=4)
    assert all(a is b for a, b in zip(again, out)) and engine.adapter.generates == 5


def test_generate_many_is_one_batch_on_a_tiny_llava(tmp_path):
    """All methods' answers of one image from one batched call, equal to their one-by-one answers
    (tie rule of tests/models/batch_check.py); the in-LLM method answers alone."""
    from tests.models.batch_check import compare, one_by_one
    from tests.models.tiny_llava import save_tiny, scene

    torch.manual_seed(0)
    adapter = mipruner.load(save_tiny("llava", str(tmp_path / "llava")), device="cpu")
    batches = []
    plain_batch = adapter.generate_batch

    def counting_batch(rows, *a, **kw):
        batches.append(len(rows))
        return plain_batch(rows, *a, **kw)

    adapter.generate_batch = counting_batch  # this instance only
    eng = ModelService(adapter)
    s = eng.new_session()
    with torch.no_grad():
        key = eng.encode(s, scene(56, 56, square=(28, 14, 42, 28)), "What colour is the square?")
        methods = ["mi", "random", "similarity", "fastv"]
        out = eng.generate_many(s, key, methods, 4, {"lam": 0.5, "seed": 0, "layer": 1}, max_new_tokens=4)
        assert batches == [4]  # reference + 3 pre-LLM methods in one batch; fastv through its own loop
        enc = eng.encoded(s, key)
        sels = [None] + [eng.prune(s, key, m, 4, lam=0.5, seed=0, layer=1) for m in methods[:3]]
        for got, (ref, rec) in zip(out, one_by_one(adapter, enc, sels, 4)):
            compare(got.token_ids, ref.token_ids, rec.margins)
    assert [a.visual_tokens for a in out] == [16, 4, 4, 4, 4]
    assert eng.cached_answer(s, key, "fastv", 4, {"layer": 1}, max_new_tokens=4) is out[4]


def test_a_budget_move_redraws_the_mask_only(engine):
    """Heatmaps and pivot maps follow the scores: where a budget move leaves them equal, the same
    image objects come back (the page then re-fetches nothing for them); where the scores change
    (MI lam < 1 scores each token by its gain given the final set), the map is drawn again."""
    s = engine.new_session()
    key = engine.encode(s, picture(1, white=(8, 8, 16, 16)), PROMPT)
    methods = ["mi", Panel("mi", {"lam": 0.5}, label="mi 0.5"), "similarity"]
    a = engine.view(s, key, methods, 4, {"lam": 1.0})
    b = engine.view(s, key, methods, 9, {"lam": 1.0})
    for va, vb in zip(a, b):
        assert va.kept != vb.kept and va.mask is not vb.mask
    assert b[0].heatmap is a[0].heatmap and b[2].heatmap is a[2].heatmap  # scores = relevance: unchanged
    assert not torch.equal(a[1].selection.scores, b[1].selection.scores) and b[1].heatmap is not a[1].heatmap
    assert b[1].pivot is a[1].pivot and b[1].legend == a[1].legend  # pivots follow the PMI alone
    c = engine.view(s, key, ["mi"], 9, {"lam": 1.0}, heat_token=0)  # PMI with a word: another map
    assert c[0].heatmap is not b[0].heatmap and c[0].heat_title.startswith("PMI with")
    again = engine.view(s, key, methods, 4, {"lam": 1.0})
    for va, vg in zip(a, again):  # whatever was reused draws what a fresh drawing would
        assert np.array_equal(np.asarray(vg.heatmap), np.asarray(va.heatmap))
    fresh = ModelService(CountingAdapter(), clock=FakeClock())
    fs = fresh.new_session()
    fv = fresh.view(fs, fresh.encode(fs, picture(1, white=(8, 8, 16, 16)), PROMPT), methods, 4, {"lam": 1.0})
    for va, vf in zip(again, fv):
        assert np.array_equal(np.asarray(vf.heatmap), np.asarray(va.heatmap))


def test_drawn_compares_values_not_identity():
    from mipruner.serve.session import CachedEncoding

    e, calls = CachedEncoding(encoded=None), []

    def draw(tag):
        calls.append(tag)
        return tag

    assert e.drawn("k", torch.tensor([1.0, 2.0]), lambda: draw("a")) == "a"
    assert e.drawn("k", torch.tensor([1.0, 2.0]), lambda: draw("b")) == "a"  # equal values: no redraw
    assert e.drawn("k", torch.tensor([1.0, 2.5]), lambda: draw("c")) == "c"
    assert e.drawn("k", torch.tensor([1.0, 2.5, 0.0]), lambda: draw("d")) == "d"  # another shape
    assert e.drawn("k", torch.tensor([1, 2]), lambda: draw("e")) == "e"  # another dtype
    assert e.drawn("j", torch.tensor([1, 2]), lambda: draw("f")) == "f"  # another key
    assert calls == ["a", "c", "d", "e", "f"] and len(e.drawings) == 2
