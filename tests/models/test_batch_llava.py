"""Batched answers on the LLaVA family (tiny checkpoints): several selections of one encoding decode
as one left-padded batch and give the one-by-one answers (tie rule in batch_check.py); the keep-all
row is the unpruned answer; the GPU path (bucketed lengths + static KV cache, no compile here)
keeps the keep-all anchor and really pads and uses a static cache."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.media import Video
from mipruner.serve.batch import answer_batch, answer_items, use_decode_path
from mipruner.models.common.path import DecodePath
from mipruner.pruners import Selection

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from .batch_check import Scores, check_logits, compare, compare_all, one_by_one
from .tiny_llava import save_tiny, scene

PROMPT = "What colour is the square?"
NEW = 6
BUCKET = 16  # the GPU path's length bucket in these tests
CASES = [("llava", "image"), ("llava", "video"), ("llava_next", "image"), ("video_llava", "image"),
         ("video_llava", "video")]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_llava")
    return {f: mipruner.load(save_tiny(f, str(root / f)), device="cpu") for f in ("llava", "llava_next", "video_llava")}


@pytest.fixture(scope="module")
def encoded(adapters):
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(8)]
    video = Video(frames=frames, indices=list(range(0, 16, 2)), fps=8.0, total_frames=16)
    out = {}
    for fam, kind in CASES:
        media = video if kind == "video" else scene(112, 56, square=(70, 14, 84, 28))
        out[fam, kind] = adapters[fam].encode(media, PROMPT, need_attention=True)
    return out


def selections(adapter, enc):
    """The unpruned row, registry methods of different kinds (VisionZip: merged tokens + [CLS]
    prefix rows where the tower has one) and random kept sets of very different lengths."""
    n = enc.n_visual
    g = torch.Generator().manual_seed(3)
    sels = [None, mipruner.select(adapter, enc, "mi", max(1, n // 4), lam=0.5),
            mipruner.select(adapter, enc, "similarity", max(1, n // 2)),
            mipruner.select(adapter, enc, "visionzip", max(2, n // 3))]
    sels += [torch.randperm(n, generator=g)[:k] for k in (1, n - 1)]
    return sels


@pytest.mark.parametrize("positions", ["compact", "original"])
@pytest.mark.parametrize("fam,kind", CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_batch_equals_one_by_one(adapters, encoded, fam, kind, positions):
    a, e = adapters[fam], encoded[fam, kind]
    sels = selections(a, e)
    ref = one_by_one(a, e, sels, NEW, positions=positions)
    scores = Scores()
    got = answer_batch(a, e, sels, max_new_tokens=NEW, positions=positions, logits_processor=[scores])
    assert len({r.input_tokens for r, _ in ref}) >= 4  # really different lengths in one batch
    check_logits(scores, ref)
    done, total = compare_all(got, ref)
    assert done >= 0.75 * total, (done, total)
    # the keep-all row is the unpruned answer, and that is plain transformers' generate
    plain = a.model.generate(**e.state.ref, do_sample=False, max_new_tokens=NEW)
    plain = plain[0, e.state.ref["input_ids"].shape[1]:].tolist()
    if positions == "compact":
        compare(got[0].token_ids, plain, ref[0][1].margins)
        assert ref[0][0].token_ids == plain


def test_rows_stop_at_their_own_eos(adapters, encoded):
    """A row reaching EOS stops there (as alone) while the others go on."""
    a, e = adapters["llava"], encoded["llava", "image"]
    sels = selections(a, e)
    eos = a.generate(e, max_new_tokens=NEW).token_ids[1]  # the unpruned answer's 2nd token as EOS
    ref = one_by_one(a, e, sels, NEW, eos_token_id=eos)
    got = answer_batch(a, e, sels, max_new_tokens=NEW, eos_token_id=eos)
    assert len(ref[0][0].token_ids) <= 2 and got[0].token_ids[-1] == eos
    assert max(len(r.token_ids) for r, _ in ref) > 2  # some row went on past the keep-all row's stop
    compare_all(got, ref)


def test_rows_of_different_encodings(adapters, encoded):
    """`answer_items`: image and video encodings of one model, each with its own selection."""
    a = adapters["video_llava"]
    ei, ev = encoded["video_llava", "image"], encoded["video_llava", "video"]
    rows = [(ei, None), (ev, mipruner.select(a, ev, "mi", 20, lam=1.0)), (ev, None), (ei, torch.arange(3))]
    ref = [one_by_one(a, e, [s], NEW)[0] for e, s in rows]
    done, total = compare_all(answer_items(a, rows, max_new_tokens=NEW), ref)
    assert done >= 0.75 * total


def test_in_llm_selections_answer_one_by_one(adapters, encoded):
    a, e = adapters["llava"], encoded["llava", "image"]
    cache: dict = {}
    fastv = mipruner.select(a, e, "fastv", 5, cache=cache, layer=1)
    sels = [None, fastv, mipruner.select(a, e, "random", 5, seed=0)]
    got = answer_batch(a, e, sels, max_new_tokens=NEW, cache=cache)
    alone = mipruner.answer(a, e, fastv, max_new_tokens=NEW, cache=cache)
    assert got[1].token_ids == alone.token_ids and got[1].input_tokens == alone.input_tokens


class Shapes:
    """A forward pre-hook on the language model recording (sequence length, cache type) per call."""

    def __init__(self, adapter):
        self.lm, self.calls, self.cache_sizes = adapter.text_decoder(), [], []

    def __enter__(self):
        def hook(module, args, kwargs):
            x, cache = kwargs.get("inputs_embeds"), kwargs.get("past_key_values")
            self.calls.append((int(x.shape[1]), type(cache).__name__))
            self.cache_sizes.append(cache.get_max_length() if hasattr(cache, "get_max_length") else None)
        self.handle = self.lm.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.parametrize("fam,kind", [("llava", "image"), ("llava_next", "image"), ("video_llava", "video")])
def test_gpu_path_keeps_the_keep_all_anchor(adapters, encoded, fam, kind):
    """Bucketed lengths + static cache (the GPU path, compile off): the keep-all answer is the
    unpruned one and its first logits the unpruned prefill's last row; kept counts in one bucket
    share one padded length and one static-cache size, smaller than keep-all's (the cache is sized
    to the pruned bucket, not the unpruned prompt); the plain path is restored after."""
    a, e = adapters[fam], encoded[fam, kind]
    plain_ref = one_by_one(a, e, [None], NEW)[0]
    full = a.prefill_logits(e)[-1]
    use_decode_path(a, bucket=BUCKET, static_cache=True)
    assert a.decode_state.path == DecodePath(bucket=BUCKET, static_cache=True)
    try:
        with Shapes(a) as shapes:
            fast = one_by_one(a, e, [None], NEW)[0]
        compare(fast[0].token_ids, plain_ref[0].token_ids, plain_ref[1].margins)
        torch.testing.assert_close(fast[1].first, full, atol=1e-5, rtol=0)
        L = e.state.input_ids.numel()
        assert shapes.calls[0][0] == -(-L // BUCKET) * BUCKET and L % BUCKET  # padded
        assert {c[1] for c in shapes.calls[1:]} == {"StaticCache"}  # the steps decode in a static cache
        full_size = shapes.cache_sizes[1]
        with Shapes(a) as shapes:
            got = answer_batch(a, e, [torch.arange(2), torch.arange(4), None], max_new_tokens=2)
        assert shapes.calls[0][0] % BUCKET == 0 and shapes.calls[-1][1] == "StaticCache"
        compare(got[2].token_ids, plain_ref[0].token_ids[:2], plain_ref[1].margins)
        sizes = set()
        # the smallest and the largest kept count of the first bucket: one prefill shape, shorter than
        # keep-all's, and one static-cache size for every kept count
        base = L - e.n_visual
        top = -(-(base + 1) // BUCKET) * BUCKET
        lengths = []
        for k in (1, top - base):
            with Shapes(a) as shapes:
                a.generate(e, keep=torch.arange(k), max_new_tokens=NEW)
            lengths.append(shapes.calls[0][0])
            sizes.add(shapes.cache_sizes[1])
        assert 1 < top - base < e.n_visual and lengths == [top, top] and top < -(-L // BUCKET) * BUCKET
        assert len(sizes) == 1
        size = sizes.pop()
        assert size % BUCKET == 0 and size < full_size
    finally:
        a.use_decode_path()
    assert a.decode_path.plain


def test_decode_path_checks():
    from mipruner.models.common.path import DecodePath, round_up, trim_at_eos
    from mipruner.models.common.dummy import DummyAdapter

    assert round_up(65, 64) == 128 and round_up(64, 64) == 64 and round_up(7, 0) == 7
    assert trim_at_eos([5, 2, 9, 2], [2]) == [5, 2] and trim_at_eos([5, 9], [2]) == [5, 9]
    assert DecodePath().plain and not DecodePath(bucket=8).plain
    with pytest.raises(ValueError, match="bucket"):
        DecodePath(bucket=-1)
    with pytest.raises(ValueError, match="plain path"):
        use_decode_path(DummyAdapter(), bucket=BUCKET)
    # the path is part of the adapter's declared DecodeState, chosen by its method, never set from outside
    d = DummyAdapter()
    assert d.decode_path is d.decode_state.path and d.decode_path.plain
    with pytest.raises(AttributeError):
        d.decode_path = DecodePath(bucket=BUCKET)
    assert d.decode_state.choose(bucket=BUCKET, static_cache=True) == DecodePath(bucket=BUCKET, static_cache=True)
    assert d.decode_path == DecodePath(bucket=BUCKET, static_cache=True)
    # adapters without a batched decoder answer one by one
    enc = DummyAdapter().encode(scene(32, 32), "Is there a white square?")
    sel = Selection.from_order(torch.arange(4), torch.zeros(enc.n_visual))
    got = answer_batch(DummyAdapter(), enc, [None, sel])
    assert [g.visual_tokens for g in got] == [enc.n_visual, 4]
