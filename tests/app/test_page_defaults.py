"""The page's defaults and notes without a browser: a video's budget default (25%: over one frame of 8,
where EVS keeps frame 1 alone) and the move between the media's defaults, EVS's note saying what its rate
and the budget did, and a colour legend capped at LEGEND_CHIPS entries."""
from __future__ import annotations

import torch

from components.page import controls as C
from components.page.panels import LEGEND_CHIPS, legend_html, method_notes
from mipruner.pruners.evs import evs_pruner, k_note


def test_a_video_starts_at_the_video_share_and_an_image_at_the_image_share():
    assert C.budget_slider("%", 1568, 10.0, 8)["value"] == C.VIDEO_SHARE  # the image default follows the video
    assert C.budget_slider("%", 196, C.VIDEO_SHARE, 0, 8)["value"] == C.DEFAULT_SHARE  # and back
    assert C.budget_slider("%", 196, C.VIDEO_SHARE, 0, 0)["value"] == C.VIDEO_SHARE  # the same medium: chosen, stays
    assert C.budget_slider("%", 1568, 10.0, 8, 8)["value"] == 10.0
    assert C.budget_slider("%", 1568, 30, 8)["value"] == 30  # a chosen budget stays
    assert C.budget_slider("%", 0)["value"] == C.DEFAULT_SHARE and C.budget_slider("%", 196, 10.0)["value"] == 10.0
    assert C.budget_slider("tokens", 1568, None, 8)["value"] == round(1568 * C.VIDEO_SHARE / 100)
    assert 100 / 8 < C.VIDEO_SHARE  # more than one frame of the embedded model's 8


def test_evs_note_says_what_the_rate_and_the_budget_did():
    low = k_note(196, 8, 0.0, 157)
    assert low.startswith("K = 157 of 1568 tokens (rate 0: the budget alone)") and "frames 2-8 get none" in low
    assert "then the 196 tokens of frames 2-8" in k_note(196, 8, 0.0, 392)
    capped = k_note(196, 8, 0.5, 300)
    assert "= 784, capped by the budget 300" in capped and "then the 104 tokens" in capped
    assert "under the budget 1568" in k_note(196, 8, 0.5, 1568)
    # the note the panel shows comes from the method's own selection
    g = torch.Generator().manual_seed(0)
    visual = torch.randn(4 * 9, 8, generator=g)
    frames = torch.arange(4).repeat_interleave(9)
    sel = evs_pruner(visual, None, 12, frame_index=frames)
    sel.method = "evs"
    assert sel.extras["k_note"] == k_note(9, 4, 0.0, 12)
    assert k_note(9, 4, 0.0, 12) in method_notes(sel) and "chosen per input" not in method_notes(sel)


def test_a_long_legend_is_capped_and_counts_the_rest():
    entries = [(f"token {i} <- 2", "#112233") for i in range(80)]
    out = legend_html(entries)
    assert out.count("width:12px") == LEGEND_CHIPS and f"and {80 - LEGEND_CHIPS} more" in out
    short = legend_html(entries[: LEGEND_CHIPS + 1])  # one more than the cap: shown, not "1 more"
    assert short.count("width:12px") == LEGEND_CHIPS + 1 and "more" not in short
