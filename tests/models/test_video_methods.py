"""VidCom2 and FastVID on every family that reads video (the table's `media` holding "video": Qwen2/2.5/3-VL,
LLaVA-OneVision, Video-LLaVA, InternVL, and LLaVA-1.5 reading the frames as images), on a real encoding of a
clip by each tiny checkpoint:
  keep-all     K = N_V keeps every token, and the prefill logits and the greedy answer are the unpruned ones
               exactly;
  release      the selection equals the restatement of the released code (tests/pruners) on the encoding's
               frames (`Encoded.frame_index`), and FastVID's merged rows are what the LLM reads at the kept positions.
               The tiny models' tokens are nearly alike (FastVID's densities round to 1 and tie), so the
               restatement breaks ties as the methods do (`stable_topk`); the release leaves them to the kernel.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.media import write_video
from mipruner.models import FAMILIES
from mipruner.pruners.attention import attention_scores
from mipruner.pruners.video import frame_slots

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from ..pruners.test_fastvid import released as released_fastvid
from ..pruners.test_vidcom2 import released as released_vidcom2
from ..pruners.video_inputs import stable_topk
from .tiny import save_tiny
from .tiny_llava import scene

VIDEO = [f for f, fam in FAMILIES.items() if "video" in fam.media]
PROMPT = "What colour is the square?"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_methods")
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(8)]
    return root, write_video(frames, str(root / "clip.mp4"))


@pytest.fixture(scope="module")
def encoded(clip):
    root, video = clip
    done = {}

    def get(family: str):
        if family not in done:
            a = mipruner.load(save_tiny(family, str(root / f"tiny-{family}")), device="cpu")
            done[family] = a, a.encode(video, PROMPT, need_attention=True)
        return done[family]
    return get


def test_every_video_family_is_covered():
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_onevision", "video_llava", "internvl", "llava"} <= set(VIDEO)


@pytest.mark.parametrize("family", VIDEO)
@pytest.mark.parametrize("name", ["vidcom2", "fastvid"])
def test_keep_all_is_the_unpruned_model(encoded, family, name):
    a, e = encoded(family)
    sel = mipruner.select(a, e, name, e.n_visual)
    assert sel.keep.tolist() == list(range(e.n_visual)) and sel.tokens is None
    assert torch.equal(a.prefill_logits(e, keep=sel), a.prefill_logits(e))
    assert mipruner.answer(a, e, sel, max_new_tokens=4).token_ids == a.generate(e, max_new_tokens=4).token_ids


@pytest.mark.parametrize("family", VIDEO)
def test_equals_the_releases_on_the_encodings_frames(encoded, family):
    a, e = encoded(family)
    table = frame_slots(e.frame_index, e.n_visual, "cpu")
    frames, free = table.index, table.outside
    t, n = frames.shape
    assert t >= 2, f"{family}: the clip's encoding reads as {t} frame(s)"
    x = e.visual[frames.reshape(-1)].float()  # (T n, d) frame-major, as the release's `view(-1, tpf)`
    k = free.numel() + t * max(3, n // 3)  # 3 a frame: 2 salient tokens and an anchor
    k_f = k - free.numel()
    # VidCom2: where the release's per-frame counts sum to K_f, the very same tokens
    want, ks = released_vidcom2(x, n, k_f / (t * n), stable_topk)
    sel = mipruner.select(a, e, "vidcom2", k)
    got_frames = sel.keep[~torch.isin(sel.keep, free)]
    assert torch.equal(torch.sort(free).values, sel.keep[torch.isin(sel.keep, free)])  # the newline is kept
    expected = frames.reshape(-1)[want]
    if sum(ks) == k_f:
        assert torch.equal(got_frames, torch.sort(expected).values)
    else:
        assert bool(torch.isin(got_frames, expected).all() or torch.isin(expected, got_frames).all())
    # FastVID (one segment per frame or longer ones, as the clip's similarities give)
    att = attention_scores(e.attention, e.n_visual)[frames.reshape(-1)]
    keep, rows = released_fastvid(x, att, t, k_f // t, 8 if t >= 8 else t, 0.9, 0.4, 4, 0.6, stable_topk)
    sel = mipruner.select(a, e, "fastvid", k)
    assert torch.equal(sel.keep[~torch.isin(sel.keep, free)], frames.reshape(-1)[keep])
    at = ~torch.isin(sel.keep, free)
    torch.testing.assert_close(sel.tokens[at].float(), rows, rtol=0, atol=1e-5)  # float32, another bmm shape
    merged = a.prefill_logits(e, keep=sel)  # the merged rows reach the LLM at the kept positions
    plain = a.prefill_logits(e, keep=sel.keep)
    assert merged.shape == plain.shape
    assert not torch.equal(merged, plain) or torch.equal(sel.tokens, e.visual[sel.keep])


@pytest.mark.parametrize("family", VIDEO)
def test_fastvid_answers_at_its_releases_positions(encoded, family):
    """FastVID's release feeds the kept tokens at their original position ids; so does the method here by
    default, on every family (1-D positions through the Selection's rule; Qwen's M-RoPE columns always)."""
    from mipruner.models.common.hf_adapter import ProcessorAdapter

    a, e = encoded(family)
    t = int(e.frame_index.max()) + 1
    sel = mipruner.select(a, e, "fastvid", max(t * 3, e.n_visual // 3))
    assert sel.positions == "original"
    if not isinstance(a, ProcessorAdapter):  # Qwen: the kept tokens keep their unpruned M-RoPE columns
        return
    p = a.pruned_inputs(e, sel)
    assert p["position_ids"] is not None and torch.equal(p["position_ids"][0], p["orig_positions"])
    assert torch.equal(a.prefill_logits(e, keep=sel), a.prefill_logits(e, keep=sel, positions="original"))
    assert a.pruned_inputs(e, sel, positions="compact")["position_ids"] is None  # an explicit rule overrides
    got = mipruner.answer(a, e, sel, max_new_tokens=4).token_ids
    assert got == a.generate(e, keep=sel, max_new_tokens=4, positions="original").token_ids
