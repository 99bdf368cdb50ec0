"""The helper every two-path float comparison goes through (tests/paths.py): its tolerance is what its
docstring states, ULPS units of the dtype's resolution scaled by the reference's magnitude, and it
fails just past it. A helper that allowed 1,000 times more would let every such test pass blind."""
from __future__ import annotations

import pytest
import torch

from .paths import ULPS, assert_paths_close, tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_tolerance_is_the_stated_formula(dtype):
    eps = torch.finfo(dtype).eps
    assert ULPS == 64
    assert tolerance(torch.tensor([0.25, -0.5], dtype=dtype)) == 64 * eps  # magnitude below 1: scale 1
    assert tolerance(torch.tensor([3.0, -8.0], dtype=dtype)) == 64 * eps * 8.0  # the largest |want|
    assert tolerance(torch.tensor([1.0, float("inf"), -float("inf")], dtype=dtype)) == 64 * eps  # finite only
    assert tolerance(torch.tensor([2.0], dtype=dtype), ulps=4) == 4 * eps * 2.0


def test_it_passes_within_and_fails_just_past_the_tolerance():
    want = torch.tensor([4.0, -2.0, 0.5, 1.0], dtype=torch.float64)  # float64: the offsets are exact
    tol = tolerance(want)
    assert tol == 64 * torch.finfo(torch.float64).eps * 4.0
    assert_paths_close(want + 0.9 * tol, want)
    assert_paths_close(want - 0.9 * tol, want)
    for i in range(4):
        off = torch.zeros(4, dtype=torch.float64)
        off[i] = 1.5 * tol
        with pytest.raises(AssertionError):
            assert_paths_close(want + off, want)
    f32 = torch.tensor([1.0, 3.0], dtype=torch.float32)
    step = torch.finfo(torch.float32).eps * 2.0  # one ulp at 2 <= |x| < 4
    assert_paths_close(f32 + torch.tensor([0.0, 90 * step]), f32)  # 90 ulps at 3: 60 of the 64 units (eps x 3)
    with pytest.raises(AssertionError):
        assert_paths_close(f32 + torch.tensor([0.0, 130 * step]), f32)  # 130 ulps: 87 units


def test_infinities_shapes_dtypes_and_integers_are_exact():
    inf = float("inf")
    assert_paths_close(torch.tensor([1.0, inf, -inf]), torch.tensor([1.0, inf, -inf]))
    with pytest.raises(AssertionError):
        assert_paths_close(torch.tensor([1.0, inf]), torch.tensor([1.0, -inf]))
    with pytest.raises(AssertionError):
        assert_paths_close(torch.tensor([1.0, 1e30]), torch.tensor([1.0, inf]))
    with pytest.raises(AssertionError):
        assert_paths_close(torch.zeros(3), torch.zeros(1, 3))
    with pytest.raises(AssertionError):
        assert_paths_close(torch.zeros(3, dtype=torch.float64), torch.zeros(3))
    assert_paths_close(torch.tensor([3, 1, 2]), torch.tensor([3, 1, 2]))
    with pytest.raises(AssertionError):
        assert_paths_close(torch.tensor([3, 1, 2]), torch.tensor([3, 2, 1]))
