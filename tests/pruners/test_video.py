"""The shared video geometry (`mipruner.pruners.video`): frame tables, dissimilarity, budget splits."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mipruner.pruners.video import dissimilarity, frame_slots, split_budget, token_frames, uniqueness


def test_frame_slots_orders_by_frame_then_index():
    # two frames of 3 tokens interleaved, a newline (-1) in the middle
    f = torch.tensor([0, 1, 0, -1, 1, 0, 1])
    fr = frame_slots(f, 7)
    assert fr.index.tolist() == [[0, 2, 5], [1, 4, 6]]
    assert fr.outside.tolist() == [3] and fr.count == 2 and fr.per_frame == 3


def test_frame_slots_without_index_is_one_frame():
    fr = frame_slots(None, 5)
    assert fr.index.tolist() == [[0, 1, 2, 3, 4]] and fr.outside.numel() == 0


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([0, 0, 1]), "frames of different sizes: frame 0 has 2 visual tokens, frame 1 has 1"),
    (torch.tensor([0, 1]), r"frame_index must be \(3,\)"),
    (torch.tensor([0.0, 1.0, 1.0]), "frame_index must be"),
    (torch.tensor([0, -2, 1]), "frames >= 0"),
    (torch.tensor([-1, -1, -1]), "no visual token in any frame"),
])
def test_frame_slots_refuses_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        frame_slots(bad, 3)


def test_token_frames_marks_newlines_outside():
    f = token_frames(torch.tensor([0, 0, 1, 1, 1]), ["frame", "frame", "frame", "frame", "newline"])
    assert f.tolist() == [0, 0, 1, 1, -1] and f.dtype == torch.long


def test_dissimilarity_is_one_minus_cosine_to_the_previous_frame():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=g)
    fr = frame_slots(torch.arange(3).repeat_interleave(4), 12)
    d = dissimilarity(x, fr)
    want = 1 - F.cosine_similarity(x[4:], x[:-4], dim=-1).view(2, 4)
    assert d.shape == (3, 4) and torch.equal(d[0], torch.ones(4)) and torch.equal(d[1:], want)
    assert torch.equal(uniqueness(x, fr), d.clamp_min(0).mean(1))


def test_repeated_frames_weigh_nothing_and_split_the_budget():
    """Frames that repeat the previous one exactly: 1 - cos can round below 0 (here -1.2e-7 on every slot), which
    must read as 0, never as a negative weight that `split_budget` refuses (found on shapes-events' still frames)."""
    row = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))[2]  # a row whose cos with itself rounds above 1
    x = row.repeat(32, 1)  # 8 identical frames of 4 identical tokens
    fr = frame_slots(torch.arange(8).repeat_interleave(4), 32)
    assert (dissimilarity(x, fr)[1:].abs() < 1e-6).all()  # on this machine's CPU each rounds to -1.2e-7
    w = uniqueness(x, fr)
    assert (w >= 0).all() and w[0] == 1 and (w[1:] < 1e-6).all()
    assert split_budget(6, [4] * 8, w.tolist()) == [4, 1, 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("k,sizes,weights,want", [
    (10, [4, 4, 4], None, [4, 3, 3]),              # even: ties to the earlier frame
    (12, [4, 4, 4], None, [4, 4, 4]),
    (1, [4, 4, 4], None, [1, 0, 0]),
    (6, [4, 4, 4], [1.0, 0.0, 0.0], [4, 1, 1]),    # frame 0 full: the rest shared by room
    (6, [4, 4, 4], [3.0, 1.0, 0.0], [4, 2, 0]),    # capped at its size, the excess to the next
    (5, [2, 6], None, [1, 4]),                     # proportional to the sizes (1.25 / 3.75)
])
def test_split_budget(k, sizes, weights, want):
    got = split_budget(k, sizes, weights)
    assert got == want and sum(got) == k and all(0 <= a <= s for a, s in zip(got, sizes))


def test_split_budget_refuses_what_cannot_fit():
    with pytest.raises(ValueError, match="does not fit"):
        split_budget(13, [4, 4, 4])
    with pytest.raises(ValueError, match="weights must be"):
        split_budget(3, [4, 4], [1.0, -1.0])


def test_frame_slots_looks_up_before_any_host_copy(monkeypatch):
    """A second call on the same frame_index tensor (an encoding's: every budget, every CUDA-graph replay) is
    answered from the memo before anything is copied to the host (a device index would sync there and break
    capture); an in-place write to the tensor, or another tensor of the same content, is read again."""
    from mipruner.pruners import video

    video.clear_tables()
    index = torch.arange(4).repeat_interleave(6)
    first = video.frame_slots(index, 24)
    reads = []
    real = video._host_index
    monkeypatch.setattr(video, "_host_index", lambda f, n: reads.append(1) or real(f, n))
    assert video.frame_slots(index, 24) is first and reads == []  # no host read for the same tensor
    twin = index.clone()
    assert video.frame_slots(twin, 24) is first and reads == [1]  # same content: one read, the same table
    index[:6] = 3  # in place: the version counter moves, the table is laid out again
    index[18:] = 0
    again = video.frame_slots(index, 24)
    assert reads == [1, 1] and torch.equal(again.index[0], torch.arange(18, 24))
    video.clear_tables()
