"""Contract tests parametrised over the registry: a new pruner is tested here for free. The checks are
`mipruner.testing`'s (what `python -m mipruner.check_pruner` runs on a plug-in)."""
import pytest
import torch

import mipruner
from mipruner.pruners import get_pruner
from mipruner.pruners.selection import selection_failures
from mipruner.testing import tensor_failures

from ..conftest import TEST_DEVICE

N_V, D, N_T = 48, 16, 5


def inputs(spec, n=N_V, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    kw = dict(visual=torch.randn(n, D, generator=g).to(dtype), text=torch.randn(N_T, D, generator=g).to(dtype))
    if spec.needs_attention:
        att = torch.softmax(torch.randn(n + 1, n + 1, generator=g) * 3, dim=-1)  # [CLS] first
        kw.update(attention=att, keys=torch.randn(n + 1, 12, generator=g))
    if spec.video:  # a video of 4 frames
        kw["frame_index"] = torch.arange(n) * 4 // n
    kw = {k: v.to(TEST_DEVICE) for k, v in kw.items()}  # MIPRUNER_TEST_DEVICE (tests/conftest.py)
    if "seed" in spec.param_names:
        kw["seed"] = 0
    return kw


ALL = [n for n in mipruner.list_pruners() if get_pruner(n).stage != "llm"]  # in-LLM ones: tests/test_methods_contract.py


def test_expected_methods_registered():
    assert "mi" in ALL


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("budget", [1, 7, 0.25, N_V])
def test_selection_contract(name, budget):
    spec = get_pruner(name)
    sel = mipruner.prune(name, budget=budget, **inputs(spec))
    k = budget if isinstance(budget, int) else round(budget * N_V)
    assert selection_failures(sel, n=N_V, k=k, device=TEST_DEVICE, adaptive=spec.adaptive) == []
    kept = sel.keep.numel()  # an adaptive method (FastVID) may keep fewer, the budget its cap
    assert (kept == k or spec.adaptive and 1 <= kept <= k) and sel.method == name
    if spec.is_mi:
        assert sel.pmi.shape == (N_V, N_T) and sel.pivot.shape == (N_V,)
        assert bool(torch.isfinite(sel.pmi).all())
    if sel.tokens is not None:
        assert sel.tokens.shape == (kept, D)


@pytest.mark.parametrize("name", ALL)
def test_the_checker_for_authors_passes(name):
    """`mipruner.testing.tensor_failures`: budgets, keep-all, determinism, every choice, low precision,
    zero rows, no tensor made without device= (the checks a plug-in's author runs)."""
    assert tensor_failures(name, TEST_DEVICE) == []


@pytest.mark.parametrize("name", ALL)
def test_keep_all_returns_everything(name):
    sel = mipruner.prune(name, budget=N_V, **inputs(get_pruner(name)))
    assert sel.keep.tolist() == list(range(N_V))
    sel = mipruner.prune(name, budget=1.0, **inputs(get_pruner(name)))
    assert sel.keep.tolist() == list(range(N_V))


@pytest.mark.parametrize("name", ALL)
def test_deterministic(name):
    kw = inputs(get_pruner(name))
    a = mipruner.prune(name, budget=9, **kw)
    b = mipruner.prune(name, budget=9, **kw)
    assert torch.equal(a.keep, b.keep) and torch.equal(a.order, b.order)


@pytest.mark.parametrize("name", ALL)
def test_low_precision_inputs(name):
    spec = get_pruner(name)
    sel = mipruner.prune(name, budget=9, **inputs(spec, dtype=torch.bfloat16))
    kept = sel.keep.numel()  # an adaptive method (FastVID) may keep fewer
    assert (kept == 9 or spec.adaptive and 1 <= kept <= 9) and bool(torch.isfinite(sel.scores).all())


@pytest.mark.parametrize("name", ALL)
def test_zero_rows_never_nan(name):
    spec = get_pruner(name)
    kw = inputs(spec)
    kw["visual"][:5] = 0.0
    sel = mipruner.prune(name, budget=9, **kw)
    assert bool(torch.isfinite(sel.scores).all())
    if sel.pmi is not None:
        assert bool(torch.isfinite(sel.pmi).all())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("budget", [0, -3, N_V + 1, 0.0, 1.5, -0.2, True, "8", None])
def test_bad_budget(name, budget):
    with pytest.raises(ValueError, match="budget"):
        mipruner.prune(name, budget=budget, **inputs(get_pruner(name)))


@pytest.mark.parametrize("name", ALL)
def test_unknown_keyword_fails(name):
    with pytest.raises(TypeError, match="bogus"):
        mipruner.prune(name, budget=3, bogus=1, **inputs(get_pruner(name)))


@pytest.mark.parametrize("name", ALL)
def test_non_finite_input(name):
    kw = inputs(get_pruner(name))
    kw["visual"][2, 3] = float("nan")
    with pytest.raises(ValueError, match="visual"):
        mipruner.prune(name, budget=3, **kw)


@pytest.mark.parametrize("name", [n for n in ALL if get_pruner(n).needs_text])
def test_text_conditioned_errors(name):
    kw = inputs(get_pruner(name))
    with pytest.raises(ValueError, match="empty"):
        mipruner.prune(name, budget=3, **{**kw, "text": torch.zeros(0, D)})
    with pytest.raises(ValueError, match="width mismatch"):
        mipruner.prune(name, budget=3, **{**kw, "text": torch.randn(N_T, D + 1)})
    with pytest.raises(ValueError, match="text"):
        mipruner.prune(name, budget=3, **{**kw, "text": None})
    kw["text"][0, 0] = float("inf")
    with pytest.raises(ValueError, match="text"):
        mipruner.prune(name, budget=3, **kw)


def test_unknown_method_suggests():
    with pytest.raises(ValueError, match="Did you mean 'mi'"):
        mipruner.prune("mii", visual=torch.randn(4, 2), text=torch.randn(1, 2), budget=2)
    with pytest.raises(ValueError, match="Known: "):
        mipruner.prune("nothing-like-it", visual=torch.randn(4, 2), budget=2)


def test_budget_share_rounding():
    from mipruner.pruners import resolve_budget

    assert resolve_budget(0.5, 576) == 288
    assert resolve_budget(0.1, 576) == 58  # 57.6 rounds half up
    assert resolve_budget(0.001, 576) == 1  # never zero
    assert resolve_budget(1.0, 7) == 7


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, mipruner; print('gradio' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_finite_check_is_exact_for_huge_values():
    # the sum overflows to inf although every value is finite: no error
    V = torch.full((8, 4), 3e38)
    mipruner.prune("random", visual=V, budget=2)
    V[3, 1] = float("-inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        mipruner.prune("random", visual=V, budget=2)
