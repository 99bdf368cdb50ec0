"""Floats from two code paths, compared the one way the suite allows (docs/architecture.md, "Exactness").

Traced and eager, batched and one by one, packed and padded, captured and replayed, another kernel or
another thread count: each may round differently on another CPU (MKL picks its kernels per processor;
`MKL_CBWR=COMPATIBLE` forces another set here), so such floats are compared within a tolerance stated in
units of their dtype's resolution, scaled by the magnitude of the reference:

    |got - want| <= ulps * eps(dtype) * max(1, max|want|)        (finite entries; infinities must match)

Decisions (indices, order, tokens, answers) are still compared exactly, and exact float equality stays
where the same kernels run on the same inputs (keep-all against the unpruned model).
"""
from __future__ import annotations

import torch

# 64 float32 units: a greedy score is a difference of two reductions over N_V and N_T terms (MI at
# lam 0.5: lam * max_j PMI - (1 - lam) * max_j PMI_self), whose summation order is the kernel's choice;
# measured between traced and eager selections: 4e-8 to 7e-7 on an AMD EPYC, and up to 9.5e-7 here under
# MKL_CBWR=COMPATIBLE, at most 4.5 units by this measure (the terms subtracted are larger than the
# result); 64 leaves a margin of 14 for longer reductions and is still far below a change of decision.
ULPS = 64


def tolerance(want: torch.Tensor, ulps: int = ULPS) -> float:
    """The absolute tolerance for `want`'s dtype and magnitude."""
    finite = want[torch.isfinite(want)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    return ulps * torch.finfo(want.dtype).eps * scale


def assert_paths_close(got: torch.Tensor, want: torch.Tensor, ulps: int = ULPS, name: str = "") -> None:
    """`got` and `want` come from two code paths: equal shape, dtype and device, and within the tolerance."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    if not got.is_floating_point():
        assert torch.equal(got, want), name
        return
    torch.testing.assert_close(got, want, atol=tolerance(want, ulps), rtol=0, msg=lambda m: f"{name}: {m}")
