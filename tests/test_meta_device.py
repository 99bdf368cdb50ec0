"""Every registered method creates its tensors on its inputs' device, so it runs on a GPU.

Under `torch.set_default_device("meta")`, a tensor made without `device=` (`torch.zeros(n)`,
`torch.arange(n)`, `torch.tensor([...])`, ...) lands on the meta device: the first operation that
mixes it with the real inputs raises, and a result built from it has no data. Each method runs here
on real inputs (on TEST_DEVICE, see tests/conftest.py) with the meta default, and must return
exactly the selection it returns without it, on the inputs' device. Pre-LLM methods go through
`mipruner.prune` on tensors (every choice of their parameters, and the chunked paths above
DENSE_LIMIT); every method, in-LLM ones included, through `mipruner.select` on a tiny LLaVA.
With MIPRUNER_TEST_DEVICE=cuda the last test also checks that CUDA selects what the CPU selects.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import mipruner
from mipruner.pruners import get_pruner, list_pruners
from mipruner.pruners import mi as mi_mod
from mipruner.testing import meta_default
from mipruner.testing import tensor_inputs as _tensor_inputs

from .conftest import TEST_DEVICE
from mipruner.media import Video

from .models.tiny_llava import save_tiny, scene

N_V, K = 40, 20  # K > D (16, the width of mipruner.testing.tensor_inputs): CDPruner's kernel runs out of rank and its fallback runs too


def tensor_inputs(spec, seed: int = 0) -> dict:
    return _tensor_inputs(spec, n=N_V, seed=seed, device=TEST_DEVICE)


def variants(spec) -> list[dict]:
    """The defaults, each other choice of every choice parameter, and MI's lambda < 1 combinations."""
    out = [{}]
    for p in spec.params:
        if p.kind == "choice":
            out += [{p.name: c} for c in p.choices if c != p.default]
    if spec.name == "cdpruner":
        out += [{"theta": 1.0}, {"theta": 0.0}]
    if spec.name == "random":
        out += [{"seed": 7}]
    if "lam" in spec.param_names:
        out += [{"lam": 1.0}, {"lam": 0.3, "aggregation": "mean", "mean_weights": "kept"},
                {"lam": 0.3, "aggregation": "mean", "normalization": "minmax"},
                {"lam": 0.3, "aggregation": "mean", "mean_weights": "kept", "normalization": "minmax"}]
    if "split" in spec.param_names:
        out += [{"split": 0.0}, {"split": 1.0}]
    return out


def assert_same(got, ref):
    """`got` (made under the meta default) is `ref` (made without it), on the inputs' device."""
    for name in ("keep", "order", "scores", "pmi", "pivot", "tokens"):
        a, b = getattr(got, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.device == TEST_DEVICE, f"{name} is on {a.device}, the inputs on {TEST_DEVICE}"
            assert torch.equal(a, b), name
    for name, value in got.extras.items():
        if isinstance(value, torch.Tensor):
            assert value.device.type != "meta", f"extras[{name!r}] is a meta tensor"
            assert torch.equal(value, ref.extras[name]), name


PRE_LLM = [n for n in list_pruners() if get_pruner(n).stage != "llm"]


@pytest.mark.parametrize("name", PRE_LLM)
@pytest.mark.parametrize("chunked", [False, True], ids=["dense", "chunked"])
def test_prune_creates_no_tensor_off_the_inputs_device(name, chunked, monkeypatch):
    spec = get_pruner(name)
    kw = tensor_inputs(spec)
    if chunked:  # MI, DivPrune and CDPruner never hold the N_V x N_V matrix: the per-step column path
        monkeypatch.setattr(mi_mod, "DENSE_LIMIT", 8)
        monkeypatch.setattr(mi_mod, "_CHUNK", 16)
    for params in variants(spec):
        ref = mipruner.prune(name, budget=K, **kw, **params)
        cache: dict = {}
        with meta_default():
            got = mipruner.prune(name, budget=K, **kw, **params)
            cached = [mipruner.prune(name, budget=K, cache=cache, **kw, **params) for _ in range(2)] \
                if "cache" in inspect.signature(spec.fn).parameters else []
        assert_same(got, ref)
        for c in cached:  # the cached normalisers too were made on the inputs' device
            assert_same(c, ref)


@pytest.fixture(scope="module")
def tiny_both(tmp_path_factory):
    ad = mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("meta") / "llava")), device=TEST_DEVICE)
    enc = ad.encode(scene(square=(8, 8, 40, 40)), "What colour is the square?", need_attention=True)
    frames = [scene(square=(8 + 6 * i, 8, 40 + 6 * i, 40), seed=i) for i in range(4)]
    clip = ad.encode(Video(frames=frames, indices=[0, 1, 2, 3], fps=4.0, total_frames=4),
                     "What colour is the square?", need_attention=True)
    return ad, enc, clip


@pytest.fixture(scope="module")
def tiny(tiny_both):
    return tiny_both[:2]


@pytest.mark.parametrize("name", list_pruners())
def test_select_creates_no_tensor_off_the_inputs_device(tiny_both, name):
    ad, image, clip = tiny_both
    spec = get_pruner(name)
    enc = clip if spec.video else image  # a video method (EVS) reads a clip
    budget = 5
    ref = mipruner.select(ad, enc, name, budget)
    with meta_default():
        got = mipruner.select(ad, enc, name, budget)
        got_cached = mipruner.select(ad, enc, name, budget, cache={})
    for sel in (got, got_cached):
        assert sel.keep.device.type != "meta" and torch.equal(sel.keep.cpu(), ref.keep.cpu())
        assert torch.equal(sel.order.cpu(), ref.order.cpu())
        assert torch.allclose(sel.scores.cpu(), ref.scores.cpu(), equal_nan=True)
    if spec.stage != "llm":  # pre-LLM selections live on the device of the encoding's visual tokens
        assert got.keep.device == enc.visual.device


@pytest.mark.parametrize("name", [n for n in PRE_LLM if not get_pruner(n).video] + ["evs"])
def test_video_selection_creates_no_tensor_off_the_inputs_device(tiny_both, name):
    """EVS and every method's per-frame option on a clip, the frame tables laid out afresh under the meta
    default (the memo emptied first), select the same tokens on the inputs' device."""
    from mipruner.pruners import video

    ad, _, clip = tiny_both
    runs = [{"video_pruning_rate": 0.0}, {"video_pruning_rate": 0.5}] if name == "evs" else \
        [{"per_frame": "even"}, {"per_frame": "uniqueness"}]
    for params in runs:
        ref = mipruner.select(ad, clip, name, 9, **params)
        video.clear_tables()
        with meta_default():
            got = mipruner.select(ad, clip, name, 9, **params)
        assert got.keep.device == clip.visual.device and torch.equal(got.keep, ref.keep)
        assert torch.equal(got.order, ref.order) and torch.equal(got.scores, ref.scores)
        for key, value in got.extras.items():
            if isinstance(value, torch.Tensor):
                assert value.device.type != "meta" and torch.equal(value, ref.extras[key]), key


def test_the_meta_default_catches_a_tensor_made_without_device():
    """The mechanism the tests above rely on: a factory call without device= breaks the computation."""
    x = torch.randn(6)
    with meta_default():
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.maximum(torch.zeros(6), x)
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.arange(6).tolist()
        assert torch.zeros(6, device=x.device).device == x.device


def test_the_meta_default_leaves_no_mode_behind():
    """After the block the calling thread's torch-function modes are what they were (a leftover
    default-device mode would route every later torch call through Python)."""
    from mipruner.testing import quick_failures
    from torch.overrides import _get_current_function_mode_stack as modes

    before = list(modes())
    with meta_default():
        assert torch.zeros(1).device.type == "meta" and len(modes()) == len(before) + 1
    assert list(modes()) == before and torch.zeros(1).device.type == "cpu"
    assert quick_failures("mi") == [] and list(modes()) == before  # what a plug-in's load runs


def test_selection_to_moves_every_tensor():
    sel = mipruner.prune("mi", budget=4, **tensor_inputs(get_pruner("mi")))
    moved = sel.to("meta")
    assert moved.keep.device.type == "meta" and moved.pmi.device.type == "meta"
    assert all(v.device.type == "meta" for v in moved.extras.values() if isinstance(v, torch.Tensor))
    assert moved.method == sel.method and sel.keep.device == TEST_DEVICE  # a copy: the original stays
    assert sel.to(TEST_DEVICE) is sel


@pytest.mark.skipif(TEST_DEVICE.type == "cpu", reason="MIPRUNER_TEST_DEVICE is the CPU: nothing to compare with")
@pytest.mark.parametrize("name", PRE_LLM)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_selects_what_the_cpu_selects(name, dtype):
    """The same inputs (rounded to `dtype` once) select the same tokens on TEST_DEVICE and on the CPU.
    The inputs are Gaussian, so scores tie only with probability ~0; a mismatch is a device bug."""
    spec = get_pruner(name)
    on_cpu = {k: v.cpu().to(dtype) for k, v in tensor_inputs(spec).items()}
    for params in variants(spec):
        ref = mipruner.prune(name, budget=K, **on_cpu, **params)
        got = mipruner.prune(name, budget=K, **{k: v.to(TEST_DEVICE) for k, v in on_cpu.items()}, **params)
        assert got.keep.device == TEST_DEVICE
        assert got.order.cpu().tolist() == ref.order.tolist(), params


def test_the_tile_families_pool_their_attention_on_its_device():
    """LLaVA-OneVision's and InternVL's tower attention, pooled per view to tokens (`token_attention`,
    InternVL's `cls_attention`), is built on the attention's device (TEST_DEVICE): nothing made off it."""
    from mipruner.models.common.patch_layout import Layout, token_attention
    from mipruner.models.internvl.layout import cls_attention

    lay = Layout(n_views=2, n_pos=4)
    lay.add("tile", torch.zeros(3, dtype=torch.long), torch.zeros(3), torch.arange(3))
    box = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    for view, pos, token in ((0, 0, 0), (0, 1, 0), (0, 2, 1), (1, 0, 2), (1, 3, 2)):  # a token may own two patches
        lay.own(view, pos, token, box)
    g = torch.Generator().manual_seed(0)
    att = torch.rand(2, 5, 5, generator=g).softmax(-1).to(TEST_DEVICE)  # (views, [CLS] + 4 patches, same)
    keys = torch.rand(2, 5, 8, generator=g).to(TEST_DEVICE)
    for pool in (lambda: token_attention(lay, att, keys, offset=1), lambda: cls_attention(lay, att, keys)):
        ref = pool()
        with meta_default():
            got = pool()
        for r, x in zip(ref, got):
            assert x.device == att.device and torch.equal(x, r)
    a, _ = token_attention(lay, att, keys, offset=1)
    assert torch.allclose(a[0, 0], att[0, 1:3, 1:3].sum(1).mean()) and a[0, 2] == 0  # token 0 owns patches 0, 1


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    from .models.tiny import save_tiny as save_family

    ad = mipruner.load(save_family("qwen2_5_vl", str(tmp_path_factory.mktemp("meta") / "qwen")), device=TEST_DEVICE)
    return ad, ad.encode(scene(64, 64), "What colour is the square?")


def _answers(ad, enc, rows) -> dict:
    """Token ids of every decoding path on `rows` (selections made beforehand): one answer, the app's batch,
    the in-LLM decoder (FastV) and the GPU path (bucket + static cache), EOS masked for a fixed length."""
    from mipruner.serve.batch import answer_batch, use_decode_path

    n = 5
    fixed = ad.fixed_length_kwargs(n)
    out = {"one": mipruner.answer(ad, enc, rows[1], max_new_tokens=n, **fixed).token_ids,
           "batch": [a.token_ids for a in answer_batch(ad, enc, rows, max_new_tokens=n, **fixed)]}
    if "fastv" in list_pruners() and ad.n_layers > 1:
        cache: dict = {}
        sel = mipruner.select(ad, enc, "fastv", 4, cache=cache)
        out["fastv"] = mipruner.answer(ad, enc, sel, max_new_tokens=n, cache=cache, min_new_tokens=n).token_ids
    use_decode_path(ad, bucket=16, static_cache=True)
    try:
        out["gpu_path"] = [a.token_ids for a in answer_batch(ad, enc, rows, max_new_tokens=n, **fixed)]
    finally:
        ad.use_decode_path()
    return out


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_decoding_creates_no_tensor_off_the_inputs_device(tiny_both, tiny_qwen, family):
    """The decoding loop (greedy steps, pads of finished rows, masks, static-cache slots) under the meta default:
    a tensor made there without `device=` (the pad of a finished row, say) breaks the step; the tokens equal
    those decoded without it, on every path."""
    ad, enc = (tiny_both[0], tiny_both[1]) if family == "llava" else tiny_qwen
    rows = [None, mipruner.select(ad, enc, "mi", 4), torch.arange(3, device=enc.visual.device)]
    ref = _answers(ad, enc, rows)
    with meta_default():
        got = _answers(ad, enc, rows)
    assert got == ref and len(ref["one"]) == 5
