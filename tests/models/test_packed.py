"""Packed prefill (`mipruner/models/_packed.py`): one view's answers (the unpruned reference and five
pruned rows) make the LLM's first decoder layer process about the rows' own prompt lengths summed,
not every row padded to the longest; the answers are the one-by-one answers (tie rule in
batch_check.py); the block mask lets a token see only its own row and its encoding's shared text
prefix; and the packed prefill compiled with `torch.compile(fullgraph=True)` compiles once for two
packed lengths of one bucket, with the eager logits."""
from __future__ import annotations

import contextlib

import pytest
import torch

import mipruner
from mipruner.models import _packed as P
from mipruner.models._batch_llava import packed_inputs, packed_prefill
from mipruner.testing import embedded_encoding

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from ..paths import assert_paths_close
from . import tiny_qwen
from .batch_check import compare_all, one_by_one
from .test_qwen_family import scene

FIVE = ("mi", "random", "similarity", "attention", "divprune")


@pytest.fixture(scope="module")
def embedded():
    return embedded_encoding()


class FirstLayerRows:
    """A forward pre-hook on the first decoder layer: the (batch, length) of every call."""

    def __init__(self, adapter):
        self.layer, self.calls, self.held = adapter.text_decoder().layers[0], [], []

    def __enter__(self):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self.calls.append((int(x.shape[0]), int(x.shape[1])))
            cache = kwargs.get("past_key_values")
            held = cache.layers[0].keys if cache is not None and cache.layers[0].is_initialized else None
            self.held.append(None if held is None else tuple(held.shape[:3]))  # (B, heads, positions) before the call
        self.handle = self.layer.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    @property
    def prefill_rows(self) -> int:
        b, n = self.calls[0]
        return b * n


@contextlib.contextmanager
def compiled_path(adapter, monkeypatch):
    """The adapter on `DecodePath(bucket=64, static_cache=True, compile=True)` with dynamo's CompileCounter as
    `_packed.compiled`'s backend (it runs each captured graph eagerly: the capture is what is checked);
    yields the counter; afterwards the plain path, no compiled function kept, dynamo's caches reset."""
    from torch._dynamo.testing import CompileCounter

    from mipruner.batch import use_decode_path
    from mipruner.models._decode_path import PLAIN

    counter = CompileCounter()
    monkeypatch.setitem(P.COMPILE, "backend", counter)
    torch._dynamo.reset()
    use_decode_path(adapter, bucket=64, static_cache=True, compile=True)
    try:
        yield counter
    finally:
        adapter.decode_path = PLAIN
        for name in [k for k in vars(adapter) if k.startswith("_compiled_")]:
            delattr(adapter, name)
        torch._dynamo.reset()


def test_one_view_pays_for_its_own_tokens(embedded):
    """Reference + five methods at 16 of 196 tokens on the embedded model: the prefill processes at most
    1.25x the rows' own lengths summed (6 x 207 = 1,242 rows when padded, 3.6x), and every answer is
    its one-by-one answer."""
    a, e = embedded
    cache: dict = {}
    sels = [None] + [mipruner.select(a, e, m, 16, cache=cache, strict=False) for m in FIVE]
    with FirstLayerRows(a) as rows:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=4, cache=cache)
    own = sum(g.input_tokens for g in got)
    assert [g.input_tokens for g in got][1:] == [got[1].input_tokens] * 5 < [got[0].input_tokens] * 5
    assert rows.prefill_rows <= 1.25 * own, (rows.calls[0], own)
    shared = int(e.state["visual_positions"][0])  # the text before the image runs once
    assert rows.prefill_rows == own - 5 * shared and shared > 0
    assert all(b * n == 6 for b, n in rows.calls[1:])  # the decoding steps: the six rows' tokens in one call
    # decoded on the packed cache itself: it holds the prefill's rows and six per step, not six padded rows
    assert [h[0] * h[2] for h in rows.held[1:]] == [rows.prefill_rows + 6 * i for i in range(len(rows.calls) - 1)]
    ref = one_by_one(a, e, sels, 4)
    done, total = compare_all(got, ref)
    assert done >= 0.75 * total, (done, total)


def test_the_block_mask_keeps_rows_apart():
    """Two rows of one encoding sharing 2 tokens, and a row of another encoding: each token sees the
    earlier tokens of its own row and of its encoding's shared prefix, nothing else; the cache index
    puts each row's tokens, in order, at the right of its (B, W) row."""
    plan = P.plan([4, 3, 5], ["a", "a", "b"], [2, 2, 2], bucket=8)
    assert plan.total == 16 and plan.real == 2 + 2 + 1 + 5 and plan.width == 8
    assert plan.rows == [[0, 1, 2, 3], [0, 1, 4], [5, 6, 7, 8, 9]]
    m = P.packed_mask(plan, "cpu", torch.float32, boolean=True)[0, 0]
    for i, r in enumerate(plan.rows):
        for q_at, q in enumerate(r):
            seen = set(torch.nonzero(m[q]).flatten().tolist())
            assert seen == set(r[:q_at + 1]), (i, q, seen)
    assert all(set(torch.nonzero(m[q]).flatten().tolist()) <= set(range(10, q + 1)) for q in range(10, 16))
    additive = P.packed_mask(plan, "cpu", torch.float32, boolean=False)[0, 0]
    assert torch.equal(additive == 0, m)
    index, real, last = P.gather_index(plan, "cpu")
    assert index.view(3, 8)[1, -3:].tolist() == [0, 1, 4] and real[1].tolist() == [0] * 5 + [1] * 3
    assert last.tolist() == [3, 4, 9]


def test_qwen_packs_its_rows(tmp_path):
    """Qwen2-VL: the packed prefill processes the rows' lengths less the shared prefix, and the answers
    are the one-by-one answers (M-RoPE positions and visual rows in packed order)."""
    a = mipruner.load(tiny_qwen.build("qwen2_vl", str(tmp_path)))
    e = a.encode(scene(), "What is red in the image?")
    n = e.n_visual
    sels = [None, torch.arange(0, n, 3), torch.arange(1, n, 2), torch.arange(n // 2)]
    with FirstLayerRows(a) as rows:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=4)
    shared = int(e.state["visual_positions"][0])
    assert rows.prefill_rows == sum(g.input_tokens for g in got) - 3 * shared and shared > 0
    # decoded in the packed cache: the prefill's rows and four more per step, nothing gathered
    assert [h[0] * h[2] for h in rows.held[1:]] == [rows.prefill_rows + 4 * i for i in range(len(rows.calls) - 1)]
    done, total = compare_all(got, one_by_one(a, e, sels, 4))
    assert done >= 0.75 * total, (done, total)


def test_the_packed_prefill_compiles_once_per_bucket(embedded):
    """`torch.compile(fullgraph=True)` of the packed prefill (backend: dynamo's CompileCounter, which
    runs the captured graph eagerly: the capture is what is checked here, not a CPU code generator)
    at two packed lengths of one bucket: one graph, logits equal to the eager prefill's."""
    from torch._dynamo.testing import CompileCounter

    a, e = embedded
    counter = CompileCounter()
    compiled = torch.compile(packed_prefill, fullgraph=True, backend=counter, dynamic=False)
    totals = []
    for k in (10, 14):
        rows = [(e, None), (e, torch.arange(k)), (e, torch.arange(1, k + 1))]
        b = packed_inputs(a, rows, bucket=64)
        totals.append((b["plan"].real, b["plan"].total))
        got, _ = compiled(a.model, b)
        want, _ = packed_prefill(a.model, b)
        assert_paths_close(got, want, name="traced against eager logits")
    assert totals[0][0] != totals[1][0] and totals[0][1] == totals[1][1]  # two lengths, one bucket
    assert counter.frame_count == 1


def test_the_compiled_path_runs_prefill_and_steps_compiled(embedded, monkeypatch):
    """`DecodePath(bucket, static_cache, compile)`: the packed prefill and the decoding step go through
    `torch.compile` (backend: CompileCounter, set in `_packed.COMPILE`); two kept counts of one bucket
    capture one prefill graph and one step graph (the step: one shape at every step), and the answers
    are the plain path's (tie rule)."""
    from .batch_check import compare

    a, e = embedded
    keeps = [torch.arange(10), torch.arange(3, 17)]
    ref = one_by_one(a, e, keeps, 4, min_new_tokens=4)
    with compiled_path(a, monkeypatch) as counter:
        got = [a.generate(e, k, max_new_tokens=4, min_new_tokens=4) for k in keeps]
        assert counter.frame_count == 2, counter.frame_count  # the prefill, the step
    assert [packed_inputs(a, [(e, k)], bucket=64)["plan"].total for k in keeps] == [64, 64]  # one bucket
    for g, (r, rec) in zip(got, ref):
        assert len(g.token_ids) == 4 and compare(g.token_ids, r.token_ids, rec.margins) >= 1


QWEN = [f for f, fam in mipruner.models.FAMILIES.items() if fam.folder == "qwen"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed_qwen")
    out = {}
    for kind in QWEN:
        a = mipruner.load(tiny_qwen.build(kind, str(root)))
        out[kind] = a, a.encode(scene(), "What is red in the image?")
    return out


@pytest.mark.parametrize("kind", QWEN)
def test_qwen_packed_prefill_compiles_once_per_bucket(qwen, kind):
    """Qwen's compiled packed prefill (`qwen/prefill.py`: visual rows and Qwen3-VL's deepstack placed
    before the forward), `torch.compile(fullgraph=True)` with M-RoPE positions (3, 1, S), at two packed
    lengths of one bucket: one graph, logits equal to the eager prefill's and to the plain path's packed
    prefill (the model's own forward on `mm_encoder_outputs`)."""
    from torch._dynamo.testing import CompileCounter

    from mipruner.models.qwen.batch import packed_inputs as qwen_packed
    from mipruner.models.qwen.prefill import packed_embeds, packed_prefill as qwen_prefill

    a, e = qwen[kind]
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(qwen_prefill, fullgraph=True, backend=counter, dynamic=False)
    totals = []
    for k in (3, 5):
        rows = [(e, None), (e, torch.arange(k)), (e, torch.arange(1, k + 1))]
        pk = qwen_packed(a, rows, [a._llm_inputs(enc, keep) for enc, keep in rows], bucket=64)
        totals.append((pk["plan"].real, pk["plan"].total))
        packed = packed_embeds(a, pk)
        assert packed["position_ids"].shape == (3, 1, pk["plan"].total)
        assert (packed["deepstack"] is not None) == (kind == "qwen3_vl")
        got, _ = compiled(a.model, packed)
        want, _ = qwen_prefill(a.model, packed)
        assert_paths_close(got, want, name="traced against eager logits")
        plain = a.model(input_ids=pk["input_ids"], position_ids=pk["position_ids"], attention_mask=pk["attention_mask"],
                        mm_encoder_outputs=pk["mm_encoder_outputs"], use_cache=True, logits_to_keep=pk["last"])
        torch.testing.assert_close(want, plain.logits, atol=1e-5, rtol=0)
    assert totals[0][0] != totals[1][0] and totals[0][1] == totals[1][1]  # two lengths, one bucket
    assert counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", QWEN)
def test_qwen_compiled_path_answers_as_the_plain_path(qwen, kind, monkeypatch):
    """Qwen on `DecodePath(bucket, static_cache, compile)`: the packed prefill and the decoding step go
    through `_packed.compiled` (backend: CompileCounter); two kept counts of one bucket in a batch with
    the unpruned row capture one prefill graph and one step graph, and the answers are the plain path's
    (tie rule)."""
    from mipruner.batch import answer_batch
    from mipruner.models.qwen.batch import packed_inputs as qwen_packed

    a, e = qwen[kind]
    n = e.n_visual
    views = [[None, torch.arange(0, n, 3), torch.arange(n // 2)], [None, torch.arange(1, n, 3), torch.arange(n // 2 - 1)]]
    plans = [qwen_packed(a, [(e, s) for s in sels], [a._llm_inputs(e, s) for s in sels], bucket=64)["plan"]
             for sels in views]
    assert plans[0].real != plans[1].real and plans[0].total == plans[1].total  # two lengths, one bucket
    refs = [one_by_one(a, e, sels, 4) for sels in views]
    with compiled_path(a, monkeypatch) as counter:
        got = [answer_batch(a, e, sels, max_new_tokens=4) for sels in views]
        assert counter.frame_count == 2, counter.frame_count  # the prefill, the step
    for g, ref in zip(got, refs):
        done, total = compare_all(g, ref)
        assert done >= 0.75 * total, (done, total)


def test_static_caches_are_kept_per_shape(embedded):
    """A view's rows and a slider move's rows alternate: each shape gets its own static cache back
    (same buffers for a compiled step), and only the last STATIC_CACHES shapes are held."""
    a, _ = embedded
    try:
        view, move = P.static_cache(a, 5, 64), P.static_cache(a, 4, 64)
        assert P.static_cache(a, 5, 64) is view and P.static_cache(a, 4, 64) is move and view is not move
        others = [P.static_cache(a, 1, 64 * (i + 2)) for i in range(P.STATIC_CACHES - 1)]
        assert P.static_cache(a, 4, 64) is move  # still held: the most recent shapes
        assert P.static_cache(a, 5, 64) is not view  # the least recently used was dropped
        assert len(a._packed_static_caches) == P.STATIC_CACHES and others
    finally:
        a.__dict__.pop("_packed_static_caches", None)


def test_the_tower_runs_compiled_when_nothing_is_recorded(embedded, monkeypatch):
    """On the compiled path an encoding that records nothing (no attention, no signal: e.g. MI's) runs
    the vision tower through `_packed.compiled` (backend: CompileCounter): two images capture once, the
    tokens equal the eager tower's; an encoding that records attention runs the eager tower with its
    hooks (nothing captured)."""
    from PIL import Image

    a, e = embedded
    images = [Image.new("RGB", (96, 80), c) for c in ((200, 30, 30), (30, 200, 30))]
    eager = [a.encode(im, e.prompt).visual for im in images]
    with compiled_path(a, monkeypatch) as counter:
        got = [a.encode(images[0], e.prompt).visual]
        captured = counter.frame_count
        got.append(a.encode(images[1], e.prompt).visual)
        with_attention = a.encode(images[0], e.prompt, need_attention=True)
        assert captured == 1 and counter.frame_count == captured, (captured, counter.frame_count)
    for g, w in zip(got, eager):  # the traced tower against the eager one: two code paths
        assert_paths_close(g, w, name="visual")
    # with attention recorded the eager tower runs: the same kernels as `eager`, so exactly its tokens
    assert torch.equal(with_attention.visual, eager[0]) and with_attention.attention is not None


def test_a_batch_of_items_runs_the_compiled_tower_once(embedded, monkeypatch):
    """`encode_items` on the compiled path, nothing recorded: the batch's ONE tower call is the compiled one,
    and each item's tokens are its one-by-one encoding's."""
    from PIL import Image

    from mipruner.batch import encode_items

    a, e = embedded
    images = [Image.new("RGB", (96, 80), c) for c in ((200, 30, 30), (30, 200, 30), (30, 30, 200))]
    eager = [a.encode(im, e.prompt).visual for im in images]
    with compiled_path(a, monkeypatch) as counter:
        got = encode_items(a, [(im, e.prompt) for im in images], batch=3)
        assert counter.frame_count == 1
    assert all(torch.allclose(g.visual, w, atol=1e-5) for g, w in zip(got, eager))
