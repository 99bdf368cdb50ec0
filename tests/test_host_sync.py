"""Host-sync guard: no selection or decoding step waits on the device once per visual token.

On a GPU every `Tensor.item`, `.tolist`, `bool(tensor)`, `int(tensor)`, `float(tensor)`, `.cpu()` or
`.numpy()` of a device tensor blocks the host until the device has caught up; one per token (a
Python loop over tokens) turns a sub-millisecond selection into N_V round trips. The CPU cannot
time that, but it can count: `SyncCounter` replaces those methods on `torch.Tensor` (through
pytest's monkeypatch, restored after the test) with wrappers that count the calls made while it is
active, whoever makes them (our code, torch, transformers).

  selections   every registered method, once through `mipruner.prune` on random inputs (N_V 64 and
               256, budgets 8 and 32, the dense and the chunked paths) and once through
               `mipruner.select` on tiny models (N_V 32 vs 128 and 16 vs 48, budgets 4 and 12): the
               count is the same at every size, and small;
  answers      one short answer (fixed number of new tokens) of the plain path, the in-LLM methods,
               the app's batch and the GPU path (bucket + static cache): the same count at every
               N_V and K, up to PER_GROUP per row of a batch (rows prefill in groups of about one
               length, padded or not: how many depends on the rows' lengths, never on N_V per se);
               one more decoding step adds exactly its path's PER_STEP (the EOS check every greedy loop
               makes, `generate`'s included, and transformers' read of a 2-D mask), so a sync added to the per-token loop fails;
  control      a method that reads one score per kept token is caught.
"""
from __future__ import annotations

import collections

import pytest
import torch

import mipruner
from mipruner.serve.batch import answer_batch, use_decode_path
from mipruner.media import write_video
from mipruner.pruners import Selection, get_pruner, list_pruners, register_pruner, unregister_pruner
from mipruner.pruners.video import NotApplicable
from mipruner.pruners import mi as mi_mod
from mipruner.testing import tensor_inputs

from .conftest import TEST_DEVICE
from .models import tester_models
from .models.tiny_llava import scene
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
SELECT_MAX = 16  # syncs of one selection, whatever N_V and K (input checks, extras for the app)
# syncs one more decoded token adds, exactly, per (answer path, family): the greedy loop's stop check (1 a step
# when the config has EOS ids; Qwen's `fixed_length_kwargs` decode without any, so none) plus transformers' own
# host read of a 2-D attention mask in its step (`create_causal_mask` tests whether it may skip the mask, as in
# `generate`, and the in-LLM decoder's mask of the kept rows at their original positions). Any sync added to a
# step fails the test.
PER_STEP = {("batch", "llava"): 2, ("gpu_path", "qwen3_vl"): 0,
            **{(m, fam): 2 for m in ("fastv", "dart") for fam in ("llava", "qwen3_vl")},
            # SparseVLM's stages split the layers in groups of their own kept rows: one mask read each
            **{("sparsevlm", fam): 3 for fam in ("llava", "qwen3_vl")}}  # every other path: 1
PER_GROUP = 1  # syncs a prefill group of a batch may add (transformers' check of its padded mask)
NEW = 3


class SyncCounter:
    """Counts the calls to SYNCS on any tensor while active (`with counter:`)."""

    def __init__(self, monkeypatch):
        self.active = False
        self.depth = 0
        self.counts: collections.Counter = collections.Counter()
        for name in SYNCS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, original))

    def _wrap(self, name, original):
        def counted(tensor, *args, **kwargs):
            if not self.active or self.depth:  # a call made by a counted one (through a torch-function mode)
                return original(tensor, *args, **kwargs)
            self.counts[name] += 1
            self.depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.depth -= 1
        counted.__name__ = name
        return counted

    def __enter__(self):
        self.counts.clear()
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def count(self, fn) -> int:
        """The syncs of one call of fn() (after one warm-up call: lazy imports and caches)."""
        fn()
        with self:
            fn()
        return self.total


@pytest.fixture
def syncs(monkeypatch):
    return SyncCounter(monkeypatch)


def test_the_counter_counts_and_is_removed(monkeypatch):
    before = torch.Tensor.item
    with monkeypatch.context() as m:
        c = SyncCounter(m)
        x = torch.arange(3, device=TEST_DEVICE)
        assert c.count(lambda: (x[0].item(), x.tolist(), bool(x[1]), int(x[2]), x.cpu())) == 5
        assert c.counts == {"item": 1, "tolist": 1, "__bool__": 1, "__int__": 1, "cpu": 1}
    assert torch.Tensor.item is before


# ------------------------------------------------------------------------------ selections
PRE = [n for n in list_pruners() if get_pruner(n).stage != "llm"]


@pytest.mark.parametrize("name", PRE)
@pytest.mark.parametrize("path", ["dense", "chunked"])
def test_a_selection_syncs_a_constant_number_of_times(syncs, monkeypatch, name, path):
    if path == "chunked":  # MI, DivPrune, CDPruner, VisPruner: the per-step column paths
        monkeypatch.setattr(mi_mod, "DENSE_LIMIT", 8)
        monkeypatch.setattr(mi_mod, "_CHUNK", 16)
    spec = get_pruner(name)
    counts = {}
    for n in (64, 256):
        kw = tensor_inputs(spec, n=n, device=TEST_DEVICE)
        for k in (8, 32):
            counts[n, k] = syncs.count(lambda: mipruner.prune(name, budget=k, **kw))
    assert len(set(counts.values())) == 1, counts
    assert counts[64, 8] <= SELECT_MAX, counts


def test_a_sync_per_token_is_caught(syncs):
    @register_pruner("sync_per_token_test", label="Sync per token (test)")
    def per_token(visual, text, budget) -> Selection:
        """Top `budget` by norm, reading each kept score on the host (what the guard catches)."""
        scores = torch.linalg.vector_norm(visual.float(), dim=1)
        order = torch.argsort(scores, descending=True)[:budget]
        _ = [float(scores[i]) for i in order]  # one host round trip per kept token
        return Selection.from_order(order, scores)

    try:
        kw = tensor_inputs(get_pruner("sync_per_token_test"), n=64, device=TEST_DEVICE)
        few = syncs.count(lambda: mipruner.prune("sync_per_token_test", budget=8, **kw))
        many = syncs.count(lambda: mipruner.prune("sync_per_token_test", budget=32, **kw))
        assert many - few >= 24
    finally:
        unregister_pruner("sync_per_token_test")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """LLaVA-1.5 (frames as images: N_V 32 and 128) and Qwen3-VL (images: N_V 16 and 48)."""
    root = tmp_path_factory.mktemp("host_sync")
    llava = mipruner.load(tester_models.build("llava", str(root)), device=TEST_DEVICE)
    qwen = mipruner.load(tester_models.build("qwen3_vl", str(root)), device=TEST_DEVICE)
    out = {}
    for nf in (2, 8):
        frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(nf)]
        out["llava", nf] = llava.encode(write_video(frames, str(root / f"clip{nf}.mp4")), "What colour is the square?",
                                        need_attention=True)
    for size, (w, h) in (("small", (64, 64)), ("large", (160, 120))):
        out["qwen3_vl", size] = qwen.encode(scene(w, h), "What colour is the square?", need_attention=True)
    return {"llava": llava, "qwen3_vl": qwen}, out


SIZES = {"llava": (2, 8), "qwen3_vl": ("small", "large")}


def _at_sizes(models, fam, fn, ks=(4, 12)) -> dict:
    """fn(adapter, encoding, k) -> {(N_V, K): syncs} at two sizes and budgets 4 and 12 (below N_V, so the
    app's batch is padded at every size: a batch with no padding skips a branch of transformers' masks)."""
    ads, encs = models
    return {(encs[fam, s].n_visual, k): fn(ads[fam], encs[fam, s], k) for s in SIZES[fam] for k in ks}


@pytest.mark.parametrize("fam", ["llava", "qwen3_vl"])
@pytest.mark.parametrize("name", list_pruners())
def test_select_on_a_model_syncs_a_constant_number_of_times(syncs, models, fam, name):
    if get_pruner(name).video and fam == "qwen3_vl":  # images: a video method does not apply (a sentence)
        with pytest.raises(NotApplicable):
            mipruner.select(models[0][fam], models[1][fam, "small"], name, 4)
        return
    ks = (8, 12) if name == "fastvid" else (4, 12)  # FastVID's R = floor(K / T) >= 1 on the 8-frame clip
    counts = _at_sizes(models, fam, lambda ad, enc, k: syncs.count(lambda: mipruner.select(ad, enc, name, k, cache={})),
                       ks)
    assert len({n for n, _ in counts}) == 2
    assert len(set(counts.values())) == 1, counts
    assert max(counts.values()) <= SELECT_MAX, counts


# ------------------------------------------------------------------------------ answers
def _fixed(ad, n: int) -> dict:
    return ad.fixed_length_kwargs(n)  # EOS masked: exactly n new tokens


def _plain(ad, enc, k, n=NEW):
    return ad.generate(enc, keep=torch.arange(k), max_new_tokens=n, **_fixed(ad, n))


def _in_llm(name):
    def run(ad, enc, k, n=NEW):
        cache: dict = {}
        sel = mipruner.select(ad, enc, name, k, cache=cache)
        return mipruner.answer(ad, enc, sel, max_new_tokens=n, cache=cache, min_new_tokens=n)
    return run


def _batch(ad, enc, k, n=NEW):
    rows = [None, torch.arange(k), torch.arange(enc.n_visual - k, enc.n_visual)]
    return answer_batch(ad, enc, rows, max_new_tokens=n, **_fixed(ad, n))


ANSWERS = {"plain": _plain, "fastv": _in_llm("fastv"), "dart": _in_llm("dart"), "sparsevlm": _in_llm("sparsevlm"),
           "batch": _batch, "gpu_path": _batch}


@pytest.mark.parametrize("fam", ["llava", "qwen3_vl"])
@pytest.mark.parametrize("what", list(ANSWERS))
def test_an_answer_syncs_a_constant_number_of_times_per_step(syncs, models, fam, what):
    ad = models[0][fam]
    run = ANSWERS[what]
    if what == "gpu_path":
        use_decode_path(ad, bucket=16, static_cache=True)
    try:
        counts = _at_sizes(models, fam, lambda a, enc, k: syncs.count(lambda: run(a, enc, k)))
        rows = 3 if what in ("batch", "gpu_path") else 0  # `_batch`'s rows: at most one prefill group each
        assert max(counts.values()) - min(counts.values()) <= PER_GROUP * rows, counts
        enc = models[1][fam, SIZES[fam][0]]
        longer = syncs.count(lambda: run(ad, enc, 4, n=NEW + 3))
        per_step = PER_STEP.get((what, fam), 1)
        assert longer - counts[enc.n_visual, 4] == 3 * per_step, (longer, counts)  # exact: one more sync a step fails
        out = run(ad, enc, 4, n=NEW + 3)
        assert len((out[0] if isinstance(out, list) else out).token_ids) == NEW + 3  # the steps really ran
    finally:
        ad.use_decode_path()


def test_a_slider_move_syncs_a_constant_number_of_times(syncs, models, tmp_path):
    """`ModelService.view` (one slider move: every method selects and its panel is drawn): its host copies
    (kept indices for the mask, scores for the heat map, one comparison with the last drawn scores)
    are per panel, never per token."""
    from mipruner.serve.service import ModelService

    ad = models[0]["llava"]
    engine = ModelService(ad)
    session = engine.new_session()
    counts = {}
    for nf in (2, 8):
        frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(nf)]
        key = engine.encode(session, write_video(frames, str(tmp_path / f"v{nf}.mp4")), "What colour is the square?",
                            need_attention=True)
        n = engine.encoded(session, key).n_visual
        for k in (8, 12):  # at least one token a frame: below it FastVID keeps the most attended (another path)
            counts[n, k] = syncs.count(lambda: engine.view(session, key, list_pruners(), k))
    assert len(set(counts.values())) == 1, counts
    assert counts[32, 8] <= 8 * len(list_pruners()), counts  # a handful per panel
