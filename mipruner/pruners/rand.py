"""Random: K visual tokens drawn uniformly without replacement (the paper's Random baseline).

    priority_i = h_seed(i) in [0, 2^32), a keyed integer hash of the token index (below)
    keep the K tokens of highest priority, ties to the lowest index (= the first K of a uniform
    random permutation, up to the hash's quality)

Original: the MI-Pruner paper's "Random" baseline (the mean of three runs with randomly selected
tokens); no code was released for it. Deliberate deviation: one call is one seed (the caller
averages seeds 0, 1, 2 as the paper does). The global RNG is never touched, so a call is
deterministic for its seed and does not disturb anyone else's random stream.

Why a hash and not `torch.rand`: the priorities are integer arithmetic on `arange(N_V)` on the
inputs' device, so a seed keeps the same tokens on every device (integer ops are exact), the
selection makes no host copy, and it can be captured as one graph (CUDA graphs, torch.compile); a
`torch.Generator` can be neither traced nor captured, and drawing on the host meant a host-to-device
copy per call. The hash is Wellons' "lowbias32" (integer-hash prospector, bias ~0.17), applied
twice, keyed by the two 32-bit halves of SplitMix64(seed) (Steele, Lea & Flood 2014): every int64
seed gives its own stream. Everything is done in int64 on values below 2^32 and each 32 x 32-bit
product is split into 16-bit halves, so no step overflows on any device. The scores are the
priorities / 2^32 as float32 (rounding can merge two of them; the order is that of the integers).
The file is `rand.py`, not `random.py`, so it never shadows the standard library module.
"""
from __future__ import annotations

import numpy as np
import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .selection import Selection

_SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed accepts any int64 seed
_M32 = 0xFFFFFFFF


def check_seed(seed: int) -> int:
    """`seed` as an int in [0, 2**63 - 1], else ValueError naming the range."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int in [0, {_SEED_MAX}], got {seed!r}")
    if not 0 <= int(seed) <= _SEED_MAX:
        raise ValueError(f"seed must be in [0, {_SEED_MAX}], got {seed}")
    return int(seed)


def splitmix64(x: int) -> int:
    """SplitMix64's output for state x (host arithmetic on Python ints, mod 2^64)."""
    z = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) and a 32-bit constant c, without int64 overflow."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32 integer hash on int64 values in [0, 2^32): a bijection of [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def priorities(n: int, seed: int, device) -> torch.Tensor:
    """(n,) int64 in [0, 2^32): token i's priority under `seed`, the same on every device."""
    key = splitmix64(seed)
    k0, k1 = key & _M32, key >> 32
    i = torch.arange(n, dtype=torch.int64, device=device)
    return lowbias32(lowbias32(i ^ k0) ^ k1)


@register_pruner("random", capture=Capturable(), label="Random", score_label=None, params=(
    Param.integer("seed", 0, 0, _SEED_MAX, "random seed (the paper averages seeds 0, 1, 2)"),))
def random_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                  seed: int = 0,  # the paper averages seeds; 0 makes the default call reproducible
                  ) -> Selection:
    """Random: K uniform picks without replacement; deterministic for a given seed."""
    seed = check_seed(seed)
    pri = priorities(visual.shape[0], seed, visual.device)  # (N_V,) int64, exact on every device
    order = torch.sort(pri, descending=True, stable=True).indices[:budget]  # (K,) ties to the lowest index
    return Selection.from_order(order, pri.to(torch.float32) * 2.0**-32)  # scores in [0, 1]
