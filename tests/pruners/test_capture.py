"""Selections as one capturable computation, the same tokens on every device.

- Every pre-LLM method with a fixed K (MI at lam 1 and 0.5 apart) traces through `mipruner.prune` as
  ONE graph under `torch.compile(fullgraph=True)` (a graph break raises) at N_V 576, K 64, and keeps
  the tokens eager mode keeps, in the same order; its scores (and PMI, merged tokens) equal eager's within
  tests/paths.py's stated tolerance, since another CPU rounds the two paths' reductions differently
  (reproduced here with MKL_CBWR=COMPATIBLE, which CI also runs). Backend: `torch._dynamo.testing.CompileCounter` (dynamo's tracing
  only, the graph then runs eagerly; it also counts the graphs): inductor would compile a greedy
  loop unrolled 64 times for minutes on a 2-core CPU, and the capture path on CUDA records the
  eager kernels anyway (`capture.py`). Width d = 16 (`mipruner.testing.tensor_inputs`): the shapes
  that matter for tracing are N_V and K; at d < K CDPruner's rank runs out, so its fallback is traced too.
- Value checks happen once at the edge (`prune`), not inside the method; `capture` decides what is
  captured; ties go to the lowest index; Random's hash is the documented one; the multi-view
  [CLS] attention is built on its inputs' device.
- On CUDA (MIPRUNER_TEST_DEVICE=cuda): every method's captured selection (a CUDA-graph replay) is
  the eager one, on the first call (eager), the second (recorded) and the third (replayed).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import mipruner
from mipruner.models.common.clip_attention import views_attention
from mipruner.pruners import capture, get_pruner, mi, rand
from mipruner.pruners.selection import check_matrix, values_checked
from mipruner.testing import meta_default, tensor_inputs

from ..conftest import TEST_DEVICE
from ..paths import assert_paths_close

N_V, K = 576, 64
FIXED_K = [("mi", {"lam": 1.0}), ("mi", {"lam": 0.5}), ("mi_attention", {}), ("mi_adaptive", {}),
           ("cdpruner", {}), ("divprune", {}), ("vispruner", {}), ("visionzip", {}), ("attention", {}),
           ("similarity", {}), ("random", {}), ("pool", {})]


def _inputs(name: str, n: int = N_V, device=TEST_DEVICE) -> tuple[torch.Tensor, torch.Tensor, dict]:
    spec = get_pruner(name)
    kw = tensor_inputs(spec, n=n, device=device)
    inputs = {k: v for k, v in kw.items() if k in ("attention", "keys") and k in _accepted(name)}
    return kw["visual"], kw["text"], inputs


def _accepted(name: str) -> set:
    import inspect

    return set(inspect.signature(get_pruner(name).fn).parameters)


def _same(a, b) -> None:
    """Traced (or captured) against eager: two code paths. The decisions exactly, the floats within
    tests/paths.py's tolerance (another CPU's kernels round the reductions differently)."""
    assert torch.equal(a.keep, b.keep) and torch.equal(a.order, b.order)
    assert_paths_close(a.scores, b.scores, name="scores")
    for f in ("pmi", "pivot", "tokens"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert_paths_close(x, y, name=f)  # pivot is an index: compared exactly there


@pytest.mark.parametrize("name,params", FIXED_K, ids=[f"{n}{''.join(f'-{k}{v}' for k, v in p.items())}" for n, p in FIXED_K])
def test_one_graph_under_torch_compile_same_tokens(name, params):
    torch._dynamo.reset()
    V, T, inputs = _inputs(name, device="cpu")
    fn = lambda V, T: mipruner.prune(name, visual=V, text=T, budget=K, **inputs, **params)  # noqa: E731
    counter = CompileCounter()
    traced = torch.compile(fn, fullgraph=True, backend=counter)(V, T)  # a graph break raises here
    assert counter.frame_count == 1 and counter.op_count > 0
    eager = fn(V, T)
    assert traced.keep.numel() == K
    _same(traced, eager)


def test_values_are_checked_once_at_the_edge():
    V, T, inputs = _inputs("visionzip", n=20, device="cpu")
    bad = inputs["attention"].clone()
    bad[3, 4] = math.nan
    with pytest.raises(ValueError, match="attention contains NaN or inf"):
        mipruner.prune("visionzip", visual=V, budget=5, attention=bad, keys=inputs["keys"])
    with pytest.raises(ValueError, match="keys contains NaN or inf"):
        mipruner.prune("visionzip", visual=V, budget=5, attention=inputs["attention"], keys=inputs["keys"] * math.inf)
    with pytest.raises(ValueError, match="visual contains NaN or inf"):
        mipruner.prune("mi", visual=V * math.nan, text=T, budget=5)
    # inside the method (within values_checked) the checks read shapes and types only: no host sync
    with values_checked():
        check_matrix("attention", bad)
        with pytest.raises(ValueError, match="must have 2 dims"):
            check_matrix("attention", bad[0])
    with pytest.raises(ValueError, match="NaN"):
        check_matrix("attention", bad)  # the flag is reset on exit


def test_what_is_captured():
    cuda = torch.device("cuda")
    assert capture.enabled(cuda) and not capture.enabled(torch.device("cpu"))
    with capture.disabled():
        assert not capture.enabled(cuda)
    assert capture.enabled(cuda)
    for name, _ in FIXED_K:
        assert capture.capturable(name, N_V, {})
    assert not capture.capturable("mi_adaptive", N_V, {"k_rule": "gain"})  # its K is read on the host
    assert not capture.capturable("vispruner", mi.DENSE_LIMIT + 1, {})  # the sparse diverse stage syncs
    assert not capture.capturable("fastv", N_V, {})
    assert not capture.capturable("mi", capture.MAX_TOKENS + 1, {})  # compute-bound there; the pool grows as N_V^2


def test_env_switches_capture_off(monkeypatch):
    monkeypatch.setenv("MIPRUNER_CAPTURE", "0")
    assert not capture.enabled(torch.device("cuda"))


@pytest.mark.parametrize("name,params", [("attention", {}), ("visionzip", {}), ("mi", {"lam": 1.0}),
                                         ("mi_attention", {"lam": 1.0}), ("mi_adaptive", {"lam": 1.0})])
def test_ties_go_to_the_lowest_index(name, params):
    n, k = 30, 7
    V = torch.ones(n, 8, device=TEST_DEVICE)  # every token alike: every score ties
    T = torch.ones(2, 8, device=TEST_DEVICE)
    att = torch.full((n + 1, n + 1), 1.0 / (n + 1), device=TEST_DEVICE)
    keys = torch.ones(n + 1, 4, device=TEST_DEVICE)
    kw = {"attention": att, "keys": keys} if get_pruner(name).needs_attention else {}
    sel = mipruner.prune(name, visual=V, text=T, budget=k, **kw, **params)
    if name == "visionzip":  # D dominant by attention (all tied: the first D), then the stride targets
        d = int(sel.extras["dominant"].numel())
        assert sel.order[:d].tolist() == list(range(d))
    else:
        assert sel.order.tolist() == list(range(k))


def _lowbias32_ref(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


@pytest.mark.parametrize("seed", [0, 1, 2**63 - 1])
def test_random_priorities_are_the_documented_hash(seed):
    key = rand.splitmix64(seed)
    ref = [_lowbias32_ref(_lowbias32_ref(i ^ (key & 0xFFFFFFFF)) ^ (key >> 32)) for i in range(50)]
    assert rand.priorities(50, seed, TEST_DEVICE).tolist() == ref
    sel = mipruner.prune("random", visual=torch.zeros(50, 3, device=TEST_DEVICE), budget=9, seed=seed)
    assert sel.order.tolist() == sorted(range(50), key=lambda i: (-ref[i], i))[:9]
    assert rand.splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from state 0


def test_views_attention_stays_on_its_inputs_device():
    g = torch.Generator().manual_seed(0)
    att_all = torch.softmax(torch.randn(2, 5, 5, generator=g), dim=-1)  # 2 views of [CLS] + 4 patches
    keys_all = torch.randn(2, 5, 3, generator=g)
    view = torch.tensor([0, 0, 0, 0, -1, 1, 1, 1, 1])
    pos = torch.tensor([1, 2, 3, 4, 0, 1, 2, 3, 4])
    ref = views_attention(att_all, keys_all, view, pos)
    with meta_default():  # a tensor made without device= would land on meta and break the result
        got = views_attention(att_all, keys_all, view, pos)
    for a, b in zip(got, ref):
        assert a.device == att_all.device and torch.equal(a, b)
    assert ref[0][0, 5] == 0 and ref[0][1, 6] == 0  # the newline token; across views


@pytest.mark.skipif(TEST_DEVICE.type != "cuda", reason="CUDA graphs: run with MIPRUNER_TEST_DEVICE=cuda")
@pytest.mark.parametrize("name,params", FIXED_K)
def test_cuda_graph_replay_is_the_eager_selection(name, params):
    capture.clear()
    V, T, inputs = _inputs(name)
    call = lambda: mipruner.prune(name, visual=V, text=T, budget=K, **inputs, **params)  # noqa: E731
    with capture.disabled():
        eager = call()
    first = call()  # the key's first sighting runs eagerly
    assert not capture._GRAPHS
    recorded, replayed = call(), call()  # recorded on the second, replayed on the third
    assert len(capture._GRAPHS) == 1 and next(iter(capture._GRAPHS.values())) is not None, "not captured"
    _same(first, eager)
    _same(recorded, eager)
    _same(replayed, eager)
    V.mul_(-1.0)  # new values in the same tensors: the replay reads them
    with capture.disabled():
        eager2 = call()
    _same(call(), eager2)


# --- capturability declared at registration; pool captured; B items as one batched call (issue 40, part 5) ---

BATCH, BATCH_N, BATCH_K = 3, 64, 12
# Scores of a batched call against one by one: both float32, from batched kernels (a batched matmul, and on the
# CPU a plain matmul where one item uses NumPy's syrk): agreement within this many float32 eps, relative.
SCORE_EPS = 64
EPS32 = torch.finfo(torch.float32).eps


def test_capturability_is_declared_by_each_method_at_registration():
    from mipruner.pruners import Capturable, list_pruners, register_pruner, unregister_pruner

    for name in list_pruners():
        spec = get_pruner(name)
        assert (spec.capture is not None) == (spec.stage != "llm"), name  # every pre-LLM method declares one
    assert get_pruner("pool").capture.static == ("grid",)
    assert capture.capturable("pool", N_V, {}) and capture.capturable(get_pruner("pool"), N_V, {})
    assert get_pruner("mi_adaptive").capture.when is not None  # its conditions are its own
    assert capture.capturable("mi_adaptive", N_V, {"k_rule": "fixed"})
    assert not capture.capturable("mi_adaptive", N_V, {"k_rule": "mass"})
    assert not hasattr(capture, "CAPTURABLE")  # no second list of names

    @register_pruner("_test_capped", capture=Capturable(max_tokens=10, when=lambda n, p: p["seed"] != 7),
                     params=(get_pruner("random").param("seed"),))
    def capped(visual, text, budget, *, seed: int = 0):
        return mipruner.prune("random", visual=visual, budget=budget, seed=seed)

    try:
        assert capture.capturable("_test_capped", 10, {}) and not capture.capturable("_test_capped", 11, {})
        assert not capture.capturable("_test_capped", 10, {"seed": 7})
    finally:
        unregister_pruner("_test_capped")
    with pytest.raises(ValueError, match="Capturable"):
        register_pruner("_test_bad", capture=True)(lambda visual, text, budget: None)


def test_pool_is_one_graph_under_torch_compile_with_its_layout_as_one_operator():
    from mipruner.pruners import pool

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    V = torch.randn(N_V, 16, generator=g)
    side = math.isqrt(N_V)
    grid = torch.stack([torch.zeros(N_V, dtype=torch.long), torch.arange(N_V) // side, torch.arange(N_V) % side], 1)
    eager = mipruner.prune("pool", visual=V, budget=K, grid=grid)  # lays out the cells (host) once
    layout = pool.device_layout(grid, N_V, K, V.device)
    assert pool.device_layout(grid.clone(), N_V, K, V.device) is layout  # memoized per grid content and K
    assert pool.device_layout(grid, N_V, K - 1, V.device) is not layout
    assert all(t.shape[0] in (N_V, K) for t in layout)  # shapes fixed by (N_V, K): a graph's outputs are static
    counter = CompileCounter()
    # the call is the memo's lookup (host Python, which a CUDA graph's replay skips) and then `pooled`'s device work
    traced = torch.compile(lambda V: pool.pooled(V, layout), fullgraph=True, backend=counter)(V)
    assert counter.frame_count == 1 and counter.op_count > 0
    # the whole `prune` call with its grid, the lookup held as one opaque operator (a graph break raises)
    torch._dynamo.reset()
    whole = CompileCounter()
    fn = lambda V, g: mipruner.prune("pool", visual=V, budget=K, grid=g)  # noqa: E731
    got = torch.compile(fn, fullgraph=True, backend=whole)(V, grid)
    assert whole.frame_count == 1 and torch.equal(got.keep, eager.keep) and torch.equal(got.tokens, eager.tokens)
    lay = pool.traced_layout(grid, V, K)  # the operator's outputs are copies of the memo's
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(lay, layout))
    assert torch.equal(traced.keep, eager.keep) and torch.equal(traced.order, eager.order)
    assert torch.equal(traced.merged_into, eager.merged_into)
    torch.testing.assert_close(traced.tokens, eager.tokens, atol=0, rtol=4 * EPS32)
    traced.scores.zero_()  # a caller writing into its selection does not write into the memo
    assert torch.equal(mipruner.prune("pool", visual=V, budget=K, grid=grid).scores, eager.scores)


BATCHABLE = [(n, p) for n, p in FIXED_K if get_pruner(n).capture.batch]
# pool is not batched (capture.batch False): on an H200 (2026-11-28) its batched call's capture copied the host
# layout during recording ("Cannot copy between CPU and CUDA tensors during CUDA graph capture") and ran eagerly;
# one item at a time it is captured (test_cuda_graph_replay_is_the_eager_selection)
BATCHABLE += [x for x in (("mi_adaptive", {"lam": 1.0}),) if x not in BATCHABLE]


def _items(name: str, b: int = BATCH, n: int = BATCH_N) -> list[dict]:
    spec = get_pruner(name)
    out = []
    for i in range(b):
        kw = tensor_inputs(spec, n=n, seed=10 + i)
        item = {k: v for k, v in kw.items() if k in ("visual", "text") or (k in spec.inputs and k != "cache")}
        if "grid" in spec.inputs:
            side = math.isqrt(n)
            item["grid"] = torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n) // side,
                                        torch.arange(n) % side], 1)
        out.append(item)
    return out


def _same_decisions(batched, one) -> None:
    """Decisions exact, floats within SCORE_EPS float32 eps (relative; absolute near 0)."""
    assert torch.equal(batched.keep, one.keep) and torch.equal(batched.order, one.order)
    assert batched.method == one.method and batched.budget == one.budget
    tol = dict(rtol=SCORE_EPS * EPS32, atol=SCORE_EPS * EPS32)
    torch.testing.assert_close(batched.scores, one.scores, **tol)
    for f in ("pmi", "tokens", "prefix"):
        x, y = getattr(batched, f), getattr(one, f)
        assert (x is None) == (y is None), f
        if x is not None:
            torch.testing.assert_close(x, y, **tol)
    for f in ("pivot", "merged_into"):
        x, y = getattr(batched, f), getattr(one, f)
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), f
    assert set(batched.extras) == set(one.extras)
    for key, x in one.extras.items():
        if isinstance(x, torch.Tensor) and not x.is_floating_point():
            assert torch.equal(batched.extras[key], x), key  # rounds, dominant, drop_round: decisions
        elif isinstance(x, torch.Tensor):
            torch.testing.assert_close(batched.extras[key], x, **tol)


@pytest.mark.parametrize("name,params", BATCHABLE, ids=[f"{n}{''.join(f'-{k}{v}' for k, v in p.items())}"
                                                         for n, p in BATCHABLE])
def test_a_batch_is_one_call_with_the_one_by_one_decisions(name, params, monkeypatch):
    from mipruner.pruners import batched

    items = _items(name)
    one = [mipruner.prune(name, budget=BATCH_K, **it, **params) for it in items]
    calls = []
    real = batched._stacked
    monkeypatch.setattr(batched, "_stacked", lambda spec: (calls.append(spec.name), real(spec))[1])
    lists = {k: [it[k] for it in items] for k in items[0]}
    got = mipruner.prune_batch(name, budget=BATCH_K, **lists, **params)
    assert calls == [name], "not one batched call"
    assert len(got) == BATCH
    for g, o in zip(got, one):
        _same_decisions(g, o)


def test_a_batch_runs_what_it_cannot_stack_one_by_one(monkeypatch):
    from mipruner.pruners import batched

    calls = []
    real = batched._stacked
    monkeypatch.setattr(batched, "_stacked", lambda spec: (calls.append(spec.name), real(spec))[1])
    items = _items("mi") + _items("mi", b=1, n=BATCH_N + 5)  # three of one shape, one of another
    got = mipruner.prune_batch("mi", budget=BATCH_K, visual=[i["visual"] for i in items],
                               text=[i["text"] for i in items])
    assert calls == ["mi"]  # the group of three; the fourth alone
    for g, it in zip(got, items):
        _same_decisions(g, mipruner.prune("mi", budget=BATCH_K, **it))
    calls.clear()
    items = _items("cdpruner")  # declares no batched call (in-place writes into its own state)
    got = mipruner.prune_batch("cdpruner", budget=BATCH_K, visual=[i["visual"] for i in items],
                               text=[i["text"] for i in items])
    assert calls == []
    for g, it in zip(got, items):
        _same(g, mipruner.prune("cdpruner", budget=BATCH_K, **it))  # the same path: the same bits
    items = _items("mi_adaptive")  # k_rule "gain" reads K on the host: not capturable, so not stacked
    got = mipruner.prune_batch("mi_adaptive", budget=BATCH_K, k_rule="gain", visual=[i["visual"] for i in items],
                               text=[i["text"] for i in items])
    assert calls == []
    for g, it in zip(got, items):
        _same(g, mipruner.prune("mi_adaptive", budget=BATCH_K, k_rule="gain", **it))
    with pytest.raises(ValueError, match="one per item"):
        mipruner.prune_batch("mi", budget=4, visual=[items[0]["visual"]] * 2, text=[items[0]["text"]])
    bad = [it["visual"].clone() for it in items]
    bad[1][0, 0] = math.nan
    with pytest.raises(ValueError, match="visual contains NaN"):
        mipruner.prune_batch("similarity", budget=4, visual=bad, text=[it["text"] for it in items])


@pytest.mark.skipif(TEST_DEVICE.type != "cuda", reason="CUDA graphs: run with MIPRUNER_TEST_DEVICE=cuda")
@pytest.mark.parametrize("name,params", BATCHABLE)
def test_cuda_batched_graph_replay_is_the_one_by_one_selection(name, params):
    capture.clear()
    items = [{k: v.to(TEST_DEVICE) for k, v in it.items()} for it in _items(name, n=N_V)]
    lists = {k: [it[k] for it in items] for k in items[0]}
    call = lambda: mipruner.prune_batch(name, budget=K, **lists, **params)  # noqa: E731
    with capture.disabled():
        one = [mipruner.prune(name, budget=K, **it, **params) for it in items]
    for _ in range(3):  # eager, recorded, replayed
        for g, o in zip(call(), one):
            _same_decisions(g, o)
    assert any(v is not None for v in capture._GRAPHS.values()), "not captured"
