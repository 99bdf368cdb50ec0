"""Random: K visual tokens drawn uniformly without replacement (the paper's Random baseline).

    priority_i ~ U[0, 1)  i.i.d., from a local generator seeded by `seed`
    keep the K tokens of highest priority   (= the first K of a uniform random permutation)

Original: the MI-Pruner paper's "Random" baseline (the mean of three runs with randomly selected
tokens); no code was released for it. Deliberate deviation: one call is one seed (the caller
averages seeds 0, 1, 2 as the paper does). The global RNG is never touched, so a call is
deterministic for its seed and does not disturb anyone else's random stream. The priorities are
drawn on the host (a CPU generator) and moved to `visual`'s device, so a seed keeps the same tokens
on every device.
The file is `rand.py`, not `random.py`, so it never shadows the standard library module.
"""
from __future__ import annotations

import numpy as np
import torch

from ._registry import Param, register_pruner
from .selection import Selection

_SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed accepts any int64 seed


def check_seed(seed: int) -> int:
    """`seed` as an int in [0, 2**63 - 1], else ValueError naming the range."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int in [0, {_SEED_MAX}], got {seed!r}")
    if not 0 <= int(seed) <= _SEED_MAX:
        raise ValueError(f"seed must be in [0, {_SEED_MAX}], got {seed}")
    return int(seed)


@register_pruner("random", label="Random", score_label=None, params=(
    Param.integer("seed", 0, 0, _SEED_MAX, "random seed (the paper averages seeds 0, 1, 2)"),))
def random_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                  seed: int = 0,  # the paper averages seeds; 0 makes the default call reproducible
                  ) -> Selection:
    """Random: K uniform picks without replacement; deterministic for a given seed."""
    seed = check_seed(seed)
    n = visual.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(seed)  # local: the global RNG is untouched
    # drawn on the host whatever the device, so a seed keeps the same tokens on every device
    priority = torch.rand(n, generator=gen, dtype=torch.float32, device="cpu").to(visual.device)  # (N_V,)
    order = torch.argsort(priority, descending=True, stable=True)[:budget]  # (K,)
    return Selection.from_order(order, priority)
