"""What the decoding engine hands the model, checked exactly (integers, no float tolerance): a row joins a
group exactly at the documented boundary (`rows.RATIO` x the group's longest), and every forward of a
batched answer (each group's prefill, each decoding step) masks in exactly each row's own tokens, left-
padded: the prefill row of L tokens attends to its L columns, the step t row to its L + t. A row whose
first token (or first new token) is masked out differs from its one-by-one run only by a small change of
its logits, which a test comparing greedy tokens under the tie rule may not see; its mask is off by one."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.models.common import rows as R
from mipruner.testing import embedded_encoding

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from . import tiny_qwen
from .test_qwen_family import scene

NEW = 3


def test_a_row_on_the_ratio_boundary_joins_the_group():
    """`>=`, not `>`: a row exactly RATIO x the head's length joins it; one token shorter starts a group."""
    for head in (10, 100, 250):
        edge = R.RATIO * head
        assert float(edge).is_integer(), edge  # lengths exactly on the boundary
        edge = int(edge)
        assert R.groups([head, edge]) == [[0, 1]], head
        assert R.groups([head, edge - 1]) == [[0], [1]], head
        assert R.groups([edge, head, edge - 1, edge]) == [[0, 1, 3], [2]], head


class Masks:
    """A forward pre-hook on the whole model: the 2-D attention mask of every call, as integers."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __enter__(self):
        def hook(module, args, kwargs):
            m = kwargs.get("attention_mask")
            self.calls.append(None if m is None else m.detach().to("cpu", torch.long).clone())
        self.handle = self.model.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def left_padded(mask: torch.Tensor) -> bool:
    """Every row: zeros, then ones to the last column (a left-padded row's real columns)."""
    n = mask.sum(dim=1)
    cols = torch.arange(mask.shape[1])[None, :]
    return bool(torch.equal(mask, (cols >= mask.shape[1] - n[:, None]).long()))


def check_masks(calls: list, lengths: list[int], new: int) -> None:
    """Prefill calls first (one per group: their rows' lengths, every row once), then one call per step."""
    assert all(m is not None and m.ndim == 2 for m in calls), [None if m is None else m.shape for m in calls]
    n_groups = len(R.groups(lengths))
    prefill, steps = calls[:n_groups], calls[n_groups:]
    assert all(left_padded(m) for m in calls)
    assert sorted(int(s) for m in prefill for s in m.sum(dim=1)) == sorted(lengths)
    assert all(m.shape[1] == int(m.sum(dim=1).max()) for m in prefill)  # a group padded to its longest row only
    assert len(steps) == new - 1  # the first token comes from the prefill
    for t, m in enumerate(steps, 1):
        assert m.shape[0] == len(lengths)
        assert sorted(int(s) for s in m.sum(dim=1)) == sorted(n + t for n in lengths), t


def test_llava_rows_attend_to_their_own_tokens():
    a, e = embedded_encoding()
    cache: dict = {}
    sels = [None] + [mipruner.select(a, e, m, k, cache=cache, strict=False)
                     for m, k in (("mi", 16), ("random", 16), ("similarity", 40), ("divprune", 120))]
    with Masks(a.model) as masks:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=NEW, cache=cache, eos_token_id=[])
    lengths = [g.input_tokens for g in got]
    assert len(R.groups(lengths)) >= 3  # several groups, so their caches are joined
    check_masks(masks.calls, lengths, NEW)


def test_qwen_rows_attend_to_their_own_tokens(tmp_path):
    a = mipruner.load(tiny_qwen.build("qwen2_vl", str(tmp_path)))
    e = a.encode(scene(), "What is red in the image?")
    n = e.n_visual
    sels = [None, torch.arange(0, n, 3), torch.arange(1, n, 2), torch.arange(n // 2), torch.arange(n - 1)]
    with Masks(a.model) as masks:
        got = mipruner.answer_batch(a, e, sels, max_new_tokens=NEW, eos_token_id=[])
    lengths = [g.input_tokens for g in got]
    assert len(R.groups(lengths)) >= 2
    check_masks(masks.calls, lengths, NEW)


@pytest.mark.parametrize("mutate", ["prefill", "step"])
def test_the_check_sees_one_masked_column(mutate):
    """The check itself: a mask with one row's first real column zeroed fails it."""
    lengths = [5, 4]  # one group (4 >= RATIO x 5)
    width = 5
    cols = torch.arange(width)[None, :]
    prefill = (cols >= width - torch.tensor(lengths)[:, None]).long()
    steps = [torch.cat([prefill, torch.ones(2, t, dtype=torch.long)], 1) for t in range(1, NEW)]
    check_masks([prefill, *steps], lengths, NEW)
    bad = [prefill.clone(), *[s.clone() for s in steps]]
    (bad[0] if mutate == "prefill" else bad[1])[1, width - 4] = 0
    with pytest.raises(AssertionError):
        check_masks(bad, lengths, NEW)
