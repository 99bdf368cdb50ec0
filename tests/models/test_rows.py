"""The decoding engine (`mipruner/models/common/`): a batch's rows prefill as padded batches grouped by
length, so one view's answers (the unpruned reference and five pruned rows) make the LLM's first
decoder layer process the rows' own prompt lengths, not every row padded to the longest; the answers
are the one-by-one answers (tie rule in batch_check.py); the prefill compiled with
`torch.compile(fullgraph=True)` compiles once for two kept counts of one bucket, with the eager logits."""
from __future__ import annotations

import contextlib

import pytest
import torch

import mipruner
from mipruner.models.common import decode as P
from mipruner.models.common.embeds_rows import rows_spec
from mipruner.models.common import rows as R
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
    `DecodeEngine.compiled`'s backend (it runs each captured graph eagerly: the capture is what is checked);
    yields the counter; afterwards the plain path, no compiled function kept, dynamo's caches reset."""
    from torch._dynamo.testing import CompileCounter

    from mipruner.serve.batch import use_decode_path

    counter = CompileCounter()
    monkeypatch.setitem(P.COMPILE, "backend", counter)
    torch._dynamo.reset()
    use_decode_path(adapter, bucket=64, static_cache=True, compile=True)
    try:
        yield counter
    finally:
        adapter.use_decode_path()
        adapter.decode_state.compiled.clear()
        torch._dynamo.reset()


def test_groups_cut_rows_by_length():
    """Longest first, a row joins the group while it is >= RATIO x the group's longest (plain path) or in
    its bucket (bucketed); a group's rows keep the batch's order; batch buckets are powers of two."""
    assert R.groups([591, 79, 79, 600, 500, 470]) == [[0, 3, 4], [5], [1, 2]]
    assert R.groups([591, 79, 79, 600], bucket=64) == [[0, 3], [1, 2]]
    assert R.groups([10]) == [[0]] and R.groups([5, 5, 5]) == [[0, 1, 2]]
    assert [R.batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [1, 2, 4, 8, 8, 16, 32]


def test_one_view_pays_for_its_own_tokens(embedded):
    """Reference + five methods at 16 of 196 tokens on the embedded model: the prefill runs as two padded
    batches (the reference alone, the five pruned rows of one length together), so the first decoder
    layer processes exactly the rows' own lengths (6 x 207 = 1,242 rows when padded to the longest, 3.6x);
    the decoding steps run the six rows at once; every answer is its one-by-one answer (tie rule)."""
    a, e = embedded
    cache: dict = {}
    sels = [None] + [mipruner.select(a, e, m, 16, cache=cache, strict=False) for m in FIVE]
    with FirstLayerRows(a) as rows:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=4, cache=cache)
    own = sum(g.input_tokens for g in got)
    assert [g.input_tokens for g in got][1:] == [got[1].input_tokens] * 5 < [got[0].input_tokens] * 5
    assert rows.calls[:2] == [(1, got[0].input_tokens), (5, got[1].input_tokens)]
    assert sum(b * n for b, n in rows.calls[:2]) == own
    assert all(c == (6, 1) for c in rows.calls[2:])  # the decoding steps: the six rows' tokens in one call
    ref = one_by_one(a, e, sels, 4)
    done, total = compare_all(got, ref)
    assert done >= 0.75 * total, (done, total)


def test_qwen_groups_its_rows(tmp_path):
    """Qwen2-VL: rows of about one length prefill together, the others apart, and the answers are the
    one-by-one answers (M-RoPE positions and visual rows per group)."""
    a = mipruner.load(tiny_qwen.build("qwen2_vl", str(tmp_path)))
    e = a.encode(scene(), "What is red in the image?")
    n = e.n_visual
    sels = [None, torch.arange(0, n, 3), torch.arange(1, n, 2), torch.arange(n // 2)]
    with FirstLayerRows(a) as rows:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=4)
    lengths = [g.input_tokens for g in got]
    want = [[i for i in g] for g in R.groups(lengths)]
    assert [c[0] for c in rows.calls[:len(want)]] == [len(g) for g in want]
    assert [c[1] for c in rows.calls[:len(want)]] == [max(lengths[i] for i in g) for g in want]
    assert all(c == (4, 1) for c in rows.calls[len(want):])
    done, total = compare_all(got, one_by_one(a, e, sels, 4))
    assert done >= 0.75 * total, (done, total)


def test_the_prefill_compiles_once_per_bucket(embedded):
    """`torch.compile(fullgraph=True)` of the padded prefill (backend: dynamo's CompileCounter, which
    runs the captured graph eagerly: the capture is what is checked here, not a CPU code generator)
    at two kept counts of one bucket: one graph, logits equal to the eager prefill's."""
    from torch._dynamo.testing import CompileCounter

    a, e = embedded
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(R.embeds_prefill, fullgraph=True, backend=counter, dynamic=False)
    for k in (10, 14):
        spec = rows_spec(a, [(e, torch.arange(k)), (e, torch.arange(1, k + 1))])
        x = spec.inputs([0, 1], 64)
        got, _ = compiled(a.model, x)
        want, _ = R.embeds_prefill(a.model, x)
        assert_paths_close(got, want, name="traced against eager logits")
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_the_compiled_path_runs_prefill_and_steps_compiled(embedded, monkeypatch):
    """`DecodePath(bucket, static_cache, compile)`: the packed prefill and the decoding step go through
    `torch.compile` (backend: CompileCounter, set in `common/decode.COMPILE`); two kept counts of one bucket
    capture one prefill graph and one step graph (the step: one shape at every step), and the answers
    are the plain path's (tie rule)."""
    from .batch_check import compare

    a, e = embedded
    keeps = [torch.arange(10), torch.arange(3, 17)]
    ref = one_by_one(a, e, keeps, 4, min_new_tokens=4)
    with compiled_path(a, monkeypatch) as counter:
        got = [a.generate(e, k, max_new_tokens=4, min_new_tokens=4) for k in keeps]
        assert counter.frame_count == 2, counter.frame_count  # the prefill, the step
    assert {R.round_up(len(e.text) + len(k), 64) for k in keeps} == {64}  # one bucket
    for g, (r, rec) in zip(got, ref):
        assert len(g.token_ids) == 4 and compare(g.token_ids, r.token_ids, rec.margins) >= 1


QWEN = [f for f, fam in mipruner.models.FAMILIES.items() if fam.folder == "qwen"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows_qwen")
    out = {}
    for kind in QWEN:
        a = mipruner.load(tiny_qwen.build(kind, str(root)))
        out[kind] = a, a.encode(scene(), "What is red in the image?")
    return out


@pytest.mark.parametrize("kind", QWEN)
def test_qwen_prefill_compiles_once_per_bucket(qwen, kind):
    """Qwen's compiled prefill (`qwen/prefill.py`: visual rows and Qwen3-VL's deepstack placed before the
    forward), `torch.compile(fullgraph=True)` with M-RoPE positions (3, n, W), at two kept counts of one
    bucket: one graph, logits equal to the eager prefill's and, within float rounding, to the plain
    path's prefill (the model's own forward on `mm_encoder_outputs`)."""
    from torch._dynamo.testing import CompileCounter

    from mipruner.models.qwen.batch import mm_prefill, rows_spec as qwen_rows
    from mipruner.models.qwen.prefill import placed_prefill

    a, e = qwen[kind]
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(placed_prefill, fullgraph=True, backend=counter, dynamic=False)
    for k in (3, 5):
        rows = [(e, torch.arange(k)), (e, torch.arange(1, k + 1))]
        placed = qwen_rows(a, rows, compiled=True).inputs([0, 1], 64)
        assert placed["position_ids"].shape == (3, 2, 64)
        assert (placed["deepstack"] is not None) == (kind == "qwen3_vl")
        got, _ = compiled(a.model, placed)
        want, _ = placed_prefill(a.model, placed)
        assert_paths_close(got, want, name="traced against eager logits")
        plain, _ = mm_prefill(a.model, qwen_rows(a, rows).inputs([0, 1], 64))
        torch.testing.assert_close(want, plain, atol=64 * torch.finfo(torch.float32).eps * float(plain.abs().max()),
                                   rtol=0)
    assert counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", QWEN)
def test_qwen_compiled_path_answers_as_the_plain_path(qwen, kind, monkeypatch):
    """Qwen on `DecodePath(bucket, static_cache, compile)`: the prefill and the decoding step go through
    `DecodeEngine.compiled` (backend: CompileCounter); two views of two kept counts per bucket capture one
    prefill graph per (rows, width) bucket and one step graph, and the answers are the plain path's
    (tie rule)."""
    from mipruner.serve.batch import answer_batch

    a, e = qwen[kind]
    n = e.n_visual
    views = [[None, torch.arange(0, n, 3), torch.arange(n // 2)], [None, torch.arange(1, n, 3), torch.arange(n // 2 - 1)]]
    refs = [one_by_one(a, e, sels, 4) for sels in views]
    shapes = set()
    for ref in refs:
        lengths = [r.input_tokens for r, _ in ref]
        shapes |= {(R.batch_bucket(len(g)), R.round_up(max(lengths[i] for i in g), 64)) for g in R.groups(lengths, 64)}
    with compiled_path(a, monkeypatch) as counter:
        got = [answer_batch(a, e, sels, max_new_tokens=4) for sels in views]
        assert counter.frame_count == len(shapes) + 1, (counter.frame_count, shapes)  # the prefills, the step
    for g, ref in zip(got, refs):
        done, total = compare_all(g, ref)
        assert done >= 0.75 * total, (done, total)


def test_static_caches_are_kept_per_shape(embedded):
    """A view's rows and a slider move's rows alternate: each shape gets its own static cache back
    (same buffers for a compiled step), and only the last STATIC_CACHES shapes are held."""
    a, _ = embedded
    try:
        view, move = a.decoder.static_cache(5, 64), a.decoder.static_cache(4, 64)
        assert a.decoder.static_cache(5, 64) is view and a.decoder.static_cache(4, 64) is move and view is not move
        others = [a.decoder.static_cache(1, 64 * (i + 2)) for i in range(P.STATIC_CACHES - 1)]
        assert a.decoder.static_cache(4, 64) is move  # still held: the most recent shapes
        assert a.decoder.static_cache(5, 64) is not view  # the least recently used was dropped
        assert len(a.decode_state.caches) == P.STATIC_CACHES and others
    finally:
        a.decode_state.caches.clear()


def test_the_tower_runs_compiled_when_nothing_is_recorded(embedded, monkeypatch):
    """On the compiled path an encoding that records nothing (no attention, no signal: e.g. MI's) runs
    the vision tower through `DecodeEngine.compiled` (backend: CompileCounter): two images capture once, the
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

    from mipruner.serve.batch import encode_items

    a, e = embedded
    images = [Image.new("RGB", (96, 80), c) for c in ((200, 30, 30), (30, 200, 30), (30, 30, 200))]
    eager = [a.encode(im, e.prompt).visual for im in images]
    with compiled_path(a, monkeypatch) as counter:
        got = encode_items(a, [(im, e.prompt) for im in images], batch=3)
        assert counter.frame_count == 1
    assert all(torch.allclose(g.visual, w, atol=1e-5) for g, w in zip(got, eager))
