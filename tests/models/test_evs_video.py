"""EVS and the per-frame option on every family that reads video (the family table's rows with "video": Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision, Video-LLaVA, InternVL, and LLaVA-1.5 reading frames as images), on
their tiny checkpoints: EVS equals a restatement of vLLM's `compute_retention_mask` (vllm-project/vllm,
vllm/multimodal/evs.py) on the encoding's (T, P, D) tokens, indices exact; the keep-all anchor; Qwen's kept
tokens keep exactly their unpruned M-RoPE positions (transformers' `get_rope_index` on the unpruned ids,
the pruned columns dropped), Qwen3-VL's deepstack rows pruned with them; odd and 1-frame videos."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.media import Video
from mipruner.models import FAMILIES
from mipruner.pruners.video import NotApplicable

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from ..pruners.test_evs import vllm_mask
from .anchor import ANCHOR_ATOL, masked_reference
from .tiny import save_tiny
from .tiny_llava import scene

VIDEO_FAMILIES = [f for f, fam in FAMILIES.items() if "video" in fam.media]
QWEN = [f for f in VIDEO_FAMILIES if f.startswith("qwen")]
PROMPT = "Where does the square go?"


def clip(n: int = 6) -> Video:
    frames = [scene(64, 48, square=(6 * i, 10, 6 * i + 16, 26), seed=i % 2) for i in range(n)]
    return Video(frames=frames, indices=list(range(n)), fps=4.0, total_frames=n)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    root, loaded = tmp_path_factory.mktemp("evs"), {}

    def get(family: str):
        if family not in loaded:
            loaded[family] = mipruner.load(save_tiny(family, str(root / family)), device="cpu")
        return loaded[family]
    return get


@pytest.fixture(scope="module")
def encoded(adapter):
    done = {}

    def get(family: str, n: int = 6):
        if (family, n) not in done:
            done[family, n] = adapter(family).encode(clip(n), PROMPT)
        return done[family, n]
    return get


def table(e) -> torch.Tensor:
    """(T, P) token indices per frame, from the geometry directly: the frame's tokens that are not newlines."""
    g = e.geometry
    frame = g.frame.tolist()
    rows = [[i for i, (f, k) in enumerate(zip(frame, g.kind)) if f == t and k != "newline"]
            for t in range(len(g.grids))]
    return torch.tensor(rows)


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
@pytest.mark.parametrize("q", [0.3, 0.75])
def test_evs_equals_vllm_on_the_encoding(adapter, encoded, family, q):
    e = encoded(family)
    assert e.is_video
    tab = table(e)
    T, P = tab.shape
    if family in QWEN:  # vLLM's own reshape: the merged grid (T, H', W') in LLM order
        h, w = e.geometry.grids[0]
        assert torch.equal(tab.flatten(), torch.arange(e.n_visual)) and h * w == P
        want = vllm_mask(e.visual.float(), (T, 2 * h, 2 * w), 2, q).nonzero().flatten()
    else:
        want = tab.flatten()[vllm_mask(e.visual.float()[tab.flatten()], (T, P, 1), 1, q)].sort().values
    sel = mipruner.select(None, e, "evs", e.n_visual, video_pruning_rate=q)
    assert T >= 2 and sel.keep.tolist() == want.tolist()
    ans = mipruner.answer(adapter(family), e, sel, max_new_tokens=2)
    assert ans.visual_tokens == want.numel()


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_keep_all_anchor(adapter, encoded, family):
    """Rate 0 at K = N_V keeps every token: the unpruned logits and greedy answer."""
    a, e = adapter(family), encoded(family)
    sel = mipruner.select(a, e, "evs", e.n_visual, video_pruning_rate=0.0)
    assert sel.keep.tolist() == list(range(e.n_visual))
    atol = ANCHOR_ATOL.get(family, 0.0)
    got, ref = a.prefill_logits(e, keep=sel), a.prefill_logits(e)
    assert torch.equal(got, ref) if not atol else torch.allclose(got, ref, atol=atol, rtol=0)
    assert mipruner.answer(a, e, sel, max_new_tokens=4).token_ids == mipruner.answer(a, e, None, max_new_tokens=4).token_ids


@pytest.mark.parametrize("family", QWEN)
def test_qwen_kept_tokens_keep_their_unpruned_positions(adapter, encoded, family):
    """The positions the LLM reads = get_rope_index on the unpruned ids, the pruned columns dropped (no integer
    cast of second_per_grid_ts, no llm_grid_w offset for the text after the video); the pruned prefill equals the
    model's own forward over the full sequence with the dropped tokens hidden (Qwen3-VL: deepstack pruned too)."""
    a, e = adapter(family), encoded(family)
    sel = mipruner.select(a, e, "evs", e.n_visual, video_pruning_rate=0.5)
    assert 0 < sel.keep.numel() < e.n_visual
    st = e.state
    ids = st.input_ids
    vis = st.vision_inputs
    positions, _ = a.model.model.get_rope_index(
        ids, mm_token_type_ids=st.mm_token_type_ids, image_grid_thw=vis.get("image_grid_thw"),
        video_grid_thw=vis.get("video_grid_thw"), **st.rope_kwargs)
    seq_keep = torch.ones(ids.shape[1], dtype=torch.bool)
    dropped = torch.ones(e.n_visual, dtype=torch.bool)
    dropped[sel.keep] = False
    seq_keep[st.visual_positions[dropped]] = False
    inputs = a._llm_inputs(e, sel)
    assert torch.equal(inputs["position_ids"].cpu(), positions[:, :, seq_keep])
    assert torch.equal(inputs["input_ids"].cpu(), ids[:, seq_keep])
    pruned = a.prefill_logits(e, keep=sel)
    torch.testing.assert_close(pruned, masked_reference(a, e, seq_keep), atol=1e-5, rtol=1e-5)
    if family == "qwen3_vl":  # the deepstack rows the LLM reads are the kept ones
        deep = inputs["mm_encoder_outputs"]["video"].deepstack_features
        for got, full in zip(deep, st.deepstack):
            assert torch.equal(got[0].cpu(), full[sel.keep])


@pytest.mark.parametrize("family", QWEN)
def test_qwen_odd_and_single_frame_videos(adapter, encoded, family):
    """Odd frame counts: the processor repeats the last frame to fill the temporal patch of 2, so 5 frames are 3
    token-frames and EVS runs on them. One frame (one token-frame): a sentence (Qwen3-VL's resize already refuses
    a clip shorter than the temporal patch, as transformers' does)."""
    e = encoded(family, 5)
    assert len(e.geometry.grids) == 3 and e.frame_index.max().item() == 2
    sel = mipruner.select(None, e, "evs", e.n_visual, video_pruning_rate=0.5)
    assert sel.keep.numel() == max(e.n_visual // 3, int(e.n_visual * 0.5))
    try:
        one = adapter(family).encode(clip(1), PROMPT)
    except ValueError as err:
        assert family == "qwen3_vl" and "at least 2 frames" in str(err)
        return
    with pytest.raises(ValueError, match="EVS compares each frame with the previous one: this input has 1 frame"):
        mipruner.select(None, one, "evs", 4)


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_per_frame_budgets_on_every_video_family(adapter, encoded, family):
    """An image method with per-frame budgets keeps its share in each frame and answers on the union."""
    a, e = adapter(family), encoded(family)
    T = len(e.geometry.grids)
    k = max(T, e.n_visual // 3)
    for split in ("even", "uniqueness"):
        sel = mipruner.select(a, e, "similarity", k, per_frame=split)
        frame = e.frame_index[sel.keep]
        per = torch.bincount(frame[frame >= 0], minlength=T)
        assert per.tolist() == sel.extras["frame_budgets"].tolist() and sel.budget == k
        if split == "even":
            assert per.max() - per.min() <= 1
        assert mipruner.answer(a, e, sel, max_new_tokens=2).visual_tokens == k
    assert mipruner.select(a, e, "pool", e.n_visual, per_frame="even").keep.tolist() == list(range(e.n_visual))


@pytest.mark.parametrize("family", [f for f in VIDEO_FAMILIES if f not in QWEN])
def test_a_one_frame_video_is_a_sentence(adapter, family):
    """A 1-frame video: EVS says it needs more frames; the per-frame option is the method alone (one frame, no
    token outside it)."""
    a = adapter(family)
    e = a.encode(clip(1), PROMPT)
    with pytest.raises(NotApplicable, match="this input has 1 frame"):
        mipruner.select(a, e, "evs", 4)
    k = max(1, e.n_visual // 2)
    if bool((e.frame_index < 0).any()):  # OneVision's closing newline is in no frame: per frame, it goes first
        return
    assert torch.equal(mipruner.select(a, e, "similarity", k, per_frame="uniqueness").keep,
                       mipruner.select(a, e, "similarity", k).keep)
