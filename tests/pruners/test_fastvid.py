"""FastVID against a restatement of its release (LunarShen/FastVID,
fastvid_llavaonevision/LLaVA-NeXT/llava/model/language_model/modeling_qwen2.py, `Qwen2Model.forward`, the
"FastVID" block), written here in plain torch from the released steps, on the same inputs: the frames' mean
token as the global feature and the encoder attention as ATS's score (what mipruner feeds it), no density
noise (the release adds U(0, 1e-6) to break ties at random)."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.pruners.attention import attention_scores

from .video_inputs import attention, video_frames, video_tokens


def released(video: torch.Tensor, frame_attn: torch.Tensor, frame_num: int, ratio_tokens: int, c: int, tau: float,
             d: float, p: int, beta: float, topk=torch.topk, split: str = "length") -> tuple[torch.Tensor, torch.Tensor]:
    """(kept indices ascending, their rows) of the release's block on video (T n, D) with per-token attention
    (T n,); `ratio_tokens` is int(frame_token_len * fastvid_retention_ratio). topk: the release's torch.topk
    (tests on encodings whose scores tie pass `stable_topk`: the release leaves ties to the kernel).
    split: "count", the release's test of one- against multi-frame segments (a frame's anchor count == C, a
    target's > C); "length", fastvid.py's (segment length 1 or more; the documented deviation). Equal density
    is broken by index (fastvid.py's deviation for the release's U(0, 1e-6) noise)."""
    video_token_len, dim = video.shape
    frame_token_len = video_token_len // frame_num
    batchframe_indices = torch.arange(frame_num).unsqueeze(1)
    alltoken_indices = torch.arange(video_token_len).view(frame_num, frame_token_len)
    video_hidden_states = video.reshape(frame_num, frame_token_len, -1)
    frame_attn_weights = frame_attn.reshape(frame_num, frame_token_len)
    # DySeg
    g = video_hidden_states.mean(1)
    g = g / g.norm(dim=1, keepdim=True)
    similarity_matrix = (g[:-1] * g[1:]).sum(dim=1)
    cut_indices_topk = topk(similarity_matrix, c - 1, largest=False).indices
    cut_indices_cos = torch.nonzero(similarity_matrix < tau, as_tuple=False).squeeze(1)
    cut_indices = torch.unique(torch.cat([cut_indices_topk, cut_indices_cos])).sort().values
    padded = torch.nn.functional.pad(cut_indices, (1, 1), value=-1)
    padded[-1] = frame_num - 1
    segment_sizes = padded.diff().tolist()
    # STPrune
    keep_indexs, final_tokens = (), []
    frame_retain_num = ratio_tokens
    frame_salient_num = frame_retain_num - int(frame_retain_num * d)
    frm_context_num_list = torch.zeros(frame_num, dtype=torch.int)
    frame_context_num = frame_retain_num - frame_salient_num
    offset = 0
    for seg_i_len in segment_sizes:
        seg_context_num = frame_context_num * seg_i_len
        temp_num = (seg_i_len + p - 1) // p
        cur_frm_context_num = seg_context_num // temp_num
        end = offset + seg_i_len
        mask = (torch.arange(seg_i_len - 1, -1, -1) % p == 0)
        frm_context_num_list[offset:end][mask] = cur_frm_context_num
        offset = end
    # ATS
    salient_indexes = topk(frame_attn_weights, frame_salient_num, dim=1).indices
    batch_indices = batchframe_indices.expand(-1, frame_salient_num)
    final_tokens.append(video_hidden_states[batch_indices, salient_indexes].view(-1, dim))
    keep_indexs += (alltoken_indices[batch_indices, salient_indexes].view(-1),)
    # density
    all_indices = torch.arange(frame_token_len).unsqueeze(0).expand(frame_num, -1)
    all_indices_mask = torch.ones_like(all_indices, dtype=torch.bool)
    all_indices_mask.scatter_(1, salient_indexes, False)
    m = frame_token_len - frame_salient_num
    filtered_indices = all_indices[all_indices_mask].view(frame_num, m)
    batch_indices = batchframe_indices.expand(-1, m)
    token_filtered = video_hidden_states[batch_indices, filtered_indices]
    alltoken_filtered_indices = alltoken_indices[batch_indices, filtered_indices]
    dist_matrix = torch.cdist(token_filtered.float(), token_filtered.float()) / (dim ** 0.5)
    dist_nearest, _ = topk(dist_matrix, k=min(4, m), dim=-1, largest=False)  # min: fastvid.py's deviation
    density = (-(dist_nearest ** 2).mean(dim=-1)).exp()
    order = torch.arange(m)
    tie = (density[:, None, :] == density[:, :, None]) & (order[None, :] < order[:, None])[None]
    density_mask = ((density[:, None, :] > density[:, :, None]) | tie).type(token_filtered.dtype)
    dist_max = dist_matrix.flatten(1).max(dim=-1)[0][:, None, None]
    dist_0, _ = (dist_matrix * density_mask + dist_max * (1 - density_mask)).min(dim=-1)
    density_score = dist_0 * density
    # DTM, single-frame segments (none without anchors: the release's argmax fails on zero anchors)
    if frame_context_num == 0:
        keep = torch.cat(keep_indexs)
        order = torch.argsort(keep)
        return keep[order], torch.cat(final_tokens)[order]
    sampled_indexs = topk(density_score, k=frame_context_num, dim=-1).indices
    batch_indices = batchframe_indices.expand(-1, frame_context_num)
    frm_context_tokens = token_filtered[batch_indices, sampled_indexs]
    frm_context_global_indexes = alltoken_filtered_indices[batch_indices, sampled_indexs]
    to_be_merge_tokens = token_filtered / token_filtered.norm(dim=-1, keepdim=True)
    merge_target_tokens = to_be_merge_tokens[batch_indices, sampled_indexs]
    similarity = torch.bmm(to_be_merge_tokens, merge_target_tokens.transpose(1, 2))
    assign_one_hot = torch.zeros(frame_num, m, frame_context_num, dtype=token_filtered.dtype)
    assign_one_hot.scatter_(2, similarity.argmax(dim=2).unsqueeze(-1), 1)
    avg_weights = (1 / (assign_one_hot.sum(dim=1).unsqueeze(-1) + 1)).clamp(min=beta)
    counts = assign_one_hot.sum(dim=1).clamp(min=1).unsqueeze(-1)
    aggregated_hidden = torch.bmm(assign_one_hot.transpose(1, 2), token_filtered) / counts
    frm_context_tokens = avg_weights * frm_context_tokens + (1 - avg_weights) * aggregated_hidden
    one_frame = torch.repeat_interleave(torch.tensor(segment_sizes) == 1, torch.tensor(segment_sizes))
    single = frm_context_num_list == frame_context_num if split == "count" else one_frame
    final_tokens.append(frm_context_tokens[single].view(-1, dim))
    keep_indexs += (frm_context_global_indexes[single].view(-1),)
    # DTM, multi-frame segments
    idx_seg_start = 0
    for seg_i_len in segment_sizes:
        if seg_i_len > 1:
            lst = frm_context_num_list[idx_seg_start:idx_seg_start + seg_i_len]
            cur_seg_context_num = int(lst[-1])
            target = lst > (frame_context_num if split == "count" else 0)
            n_target = int(target.sum())
            seg_score = density_score[idx_seg_start:idx_seg_start + seg_i_len][target]
            seg_tokens = token_filtered[idx_seg_start:idx_seg_start + seg_i_len]
            seg_target = seg_tokens[target]
            seg_tokens = seg_tokens.reshape(1, -1, dim).expand(n_target, -1, -1)
            seg_ids = alltoken_filtered_indices[idx_seg_start:idx_seg_start + seg_i_len][target]
            sampled = topk(seg_score, k=cur_seg_context_num, dim=-1).indices
            bi = batchframe_indices[:n_target].expand(-1, cur_seg_context_num)
            ctx = seg_target[bi, sampled]
            ctx_ids = seg_ids[bi, sampled]
            src = seg_tokens / seg_tokens.norm(dim=-1, keepdim=True)
            tgt = ctx / ctx.norm(dim=-1, keepdim=True)
            sim = torch.bmm(src, tgt.transpose(1, 2))
            one_hot = torch.zeros(n_target, src.shape[1], cur_seg_context_num, dtype=token_filtered.dtype)
            one_hot.scatter_(2, sim.argmax(dim=2).unsqueeze(-1), 1)
            w = (1 / (one_hot.sum(dim=1).unsqueeze(-1) + 1)).clamp(min=beta)
            cnt = one_hot.sum(dim=1).clamp(min=1).unsqueeze(-1)
            agg = torch.bmm(one_hot.transpose(1, 2), seg_tokens) / cnt
            final_tokens.append((w * ctx + (1 - w) * agg).view(-1, dim))
            keep_indexs += (ctx_ids.view(-1),)
        idx_seg_start += seg_i_len
    hidden = torch.cat(final_tokens, dim=0)
    keep = torch.cat(keep_indexs, dim=0)
    order = torch.argsort(keep)
    return keep[order], hidden[order]


PARAMS = dict(segments=8, segment_tau=0.9, context_share=0.4, anchor_stride=4, merge_beta=0.6)
CASES = [  # (T, h, w, d, scene starts, parameters)
    (12, 5, 5, 24, (0, 5, 9), {}),  # defaults: c = 8 gives 8 segments of 1 to 4 frames
    (16, 4, 6, 16, (0, 9), dict(segments=2, segment_tau=-1.0)),  # two long segments: several targets each
    (10, 6, 6, 32, (0, 2, 4, 6, 8), dict(segments=3, context_share=0.5, merge_beta=0.3, anchor_stride=3)),
]


@pytest.mark.parametrize("t,h,w,d,scenes,params", CASES)
@pytest.mark.parametrize("per_frame", [3, 6, 10])
def test_equals_the_release(t, h, w, d, scenes, params, per_frame):
    kw = {**PARAMS, **params}
    n = h * w
    v = video_tokens(t, n, d, scenes=scenes, noise=0.2)
    att = attention(t * n)
    k = t * per_frame + t // 2  # R = floor(K / T) = per_frame: the remainder unspent, as released
    sel = mipruner.prune("fastvid", visual=v, budget=k, frame_index=video_frames(t, h * w), attention=att, **kw)
    want_keep, want_rows = released(v, attention_scores(att, t * n), t, per_frame, kw["segments"],
                                    kw["segment_tau"], kw["context_share"], kw["anchor_stride"], kw["merge_beta"])
    assert torch.equal(sel.keep, want_keep)
    torch.testing.assert_close(sel.tokens, want_rows, rtol=0, atol=1e-5)  # float32 bmm of another shape
    assert 1 <= sel.keep.numel() <= k and int(sel.extras["frame_tokens"].sum()) == sel.keep.numel()
    into = sel.merged_into
    dropped = torch.ones(t * n, dtype=torch.bool).index_fill(0, sel.keep, False)
    assert bool((into[dropped] >= 0).all()) and bool((into[~dropped] == -1).all())
    assert bool(torch.isin(into[dropped], sel.keep).all())


def test_multi_frame_segments_are_exercised():
    t, h, w, d = 16, 4, 6, 16
    v = video_tokens(t, h * w, d, scenes=(0, 9), noise=0.2)
    sel = mipruner.prune("fastvid", visual=v, budget=t * 6, frame_index=video_frames(t, h * w),
                         attention=attention(t * h * w), segments=2, segment_tau=-1.0)
    assert sel.extras["segment"].tolist() == [0] * 9 + [1] * 7
    per = sel.extras["frame_tokens"].tolist()
    assert len(set(per)) > 1  # target frames hold the segment's anchors, the others only their salient tokens


def test_newline_is_kept_and_small_budgets_keep_the_most_attended():
    t, h, w, d = 8, 4, 4, 16
    n = h * w
    v = torch.cat([video_tokens(t, n, d, scenes=(0, 4)), torch.randn(1, d)])
    frame_index = video_frames(t, n, newline=True)
    att = attention(t * n + 1)
    sel = mipruner.prune("fastvid", visual=v, budget=4 * t + 1, frame_index=frame_index, attention=att)
    assert int(sel.keep[-1]) == t * n and sel.keep.numel() <= 4 * t + 1
    small = mipruner.prune("fastvid", visual=v, budget=t, frame_index=frame_index, attention=att)  # R = 0
    scores = attention_scores(att, t * n + 1)[: t * n]
    want = torch.sort(torch.cat([torch.sort(scores, descending=True, stable=True).indices[: t - 1],
                                 torch.tensor([t * n])])).values
    assert torch.equal(small.keep, want)


def test_keep_all_one_frame_and_frames_of_different_sizes():
    t, h, w, d = 4, 4, 4, 8
    v = video_tokens(t, h * w, d)
    att = attention(t * h * w)
    sel = mipruner.prune("fastvid", visual=v, budget=t * h * w, frame_index=video_frames(t, h * w), attention=att)
    assert sel.keep.tolist() == list(range(t * h * w)) and sel.tokens is None
    for frame_index in (None, torch.zeros(t * h * w, dtype=torch.long)):  # an image; a 1-frame video
        with pytest.raises(ValueError, match="1 frame"):
            mipruner.prune("fastvid", visual=v, budget=6, attention=att, frame_index=frame_index)
    with pytest.raises(ValueError, match="frames of different sizes"):
        mipruner.prune("fastvid", visual=v, budget=6, attention=att, frame_index=(torch.arange(64) >= 20).long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_tensor_made_off_the_inputs_device_and_low_precision(dtype):
    """Under the meta default device (tests/test_meta_device.py's pattern) a tensor made without device= breaks
    the run; the selection equals the one made without it, on video inputs with multi-frame segments."""
    from mipruner.testing import meta_default

    from ..conftest import TEST_DEVICE
    t, h, w, d = 16, 4, 6, 16
    kw = dict(visual=video_tokens(t, h * w, d, scenes=(0, 9), noise=0.2).to(TEST_DEVICE, dtype),
              frame_index=video_frames(t, h * w).to(TEST_DEVICE), attention=attention(t * h * w).to(TEST_DEVICE, dtype),
              segments=2, segment_tau=-1.0)
    ref = mipruner.prune("fastvid", budget=t * 6, **kw)
    with meta_default():
        from mipruner.pruners import video
        video.clear_tables()  # the frame table laid out afresh under the meta default
        got = mipruner.prune("fastvid", budget=t * 6, **kw)
    for name in ("keep", "order", "scores", "tokens", "merged_into"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.device.type == TEST_DEVICE.type and torch.equal(a, b), name  # cuda:0 is not == cuda
    assert got.tokens.dtype == dtype and bool(torch.isfinite(got.tokens.float()).all())


@pytest.mark.parametrize("stride", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("per_frame", [3, 5])  # C = 1 and C = 2 anchors a frame (context_share 0.4)
def test_every_stride_merges_every_frame_of_a_segment(stride, per_frame):
    """Issue: with anchor_stride 2 and 3 near-identical frames (one segment, C = 1), the release's count test
    (the targets' floor(C L / ceil(L / p)) == C) files the segment as one-frame segments and merges nothing of
    frame 1. Deciding by the segment's length merges every dropped token of every frame; the kept tokens are
    the release's either way."""
    t, h, w, d = 9, 4, 4, 16
    n = h * w
    v = video_tokens(t, n, d, scenes=(0, 3, 4), noise=0.05)  # segments of 3, 1 and 5 frames
    att = attention(t * n)
    kw = dict(segments=3, segment_tau=-1.0, context_share=0.4, anchor_stride=stride, merge_beta=0.6)
    sel = mipruner.prune("fastvid", visual=v, budget=t * per_frame, frame_index=video_frames(t, n), attention=att,
                         **kw)
    args = (v, attention_scores(att, t * n), t, per_frame, kw["segments"], kw["segment_tau"], kw["context_share"],
            stride, kw["merge_beta"])
    want_keep, want_rows = released(*args)
    count_keep, _ = released(*args, split="count")
    assert torch.equal(sel.keep, want_keep) and torch.equal(count_keep, want_keep)
    torch.testing.assert_close(sel.tokens, want_rows, rtol=0, atol=1e-5)
    dropped = torch.ones(t * n, dtype=torch.bool).index_fill(0, sel.keep, False)
    merged = sel.merged_into >= 0
    assert torch.equal(merged, dropped)  # every dropped token of every frame went into a kept one
    assert sel.extras["segment"].tolist() == [0] * 3 + [1] + [2] * 5


def test_the_count_rule_case_merges_frame_one():
    """The issue's case made again: 3 near-identical frames, stride 2, C = 1: frame 1's 16 tokens."""
    t, n, d = 3, 16, 8
    v = video_tokens(t, n, d, scenes=(0,), noise=0.01)
    att = attention(t * n)
    sel = mipruner.prune("fastvid", visual=v, budget=t * 3, frame_index=video_frames(t, n), attention=att,
                         segments=1, segment_tau=-1.0, anchor_stride=2)
    into = sel.merged_into.view(t, n)
    kept = torch.zeros(t * n, dtype=torch.bool).index_fill(0, sel.keep, True).view(t, n)
    assert int(((into[1] >= 0) | kept[1]).sum()) == n  # each of frame 1's tokens is kept or merged
    args = (v, attention_scores(att, t * n), t, 3, 1, -1.0, 0.4, 2, 0.6)
    _, ours = released(*args)
    _, counted = released(*args, split="count")
    assert not torch.allclose(ours, counted)  # the release's rule merges frame 1 nowhere: other rows


def test_equal_density_is_broken_by_index():
    """Repeated tokens (two flat regions of identical rows in every frame): without the release's rho noise
    every token of a region would tie as a density peak and a frame's anchors could all come from one region;
    the index rule makes one peak a region, so C = 2 anchors come one from each."""
    t, n, d = 2, 16, 8
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(d, generator=g), torch.randn(d, generator=g) * 4
    frame = torch.stack([a] * 8 + [b] * 8)  # (n, d): region A then region B
    v = torch.cat([frame, frame + 0.5])
    att = torch.softmax(torch.arange(t * n + 1, dtype=torch.float32)[None].expand(t * n + 1, -1) * 0, dim=-1)
    sel = mipruner.prune("fastvid", visual=v, budget=t * 6, frame_index=video_frames(t, n), attention=att,
                         segments=2, segment_tau=-1.0, context_share=0.4)  # R = 6: S = 4 salient, C = 2
    salient = torch.arange(4)  # uniform attention: ATS keeps each frame's first 4 (lowest index on ties)
    for f in range(t):
        kept = sel.keep[(sel.keep >= f * n) & (sel.keep < (f + 1) * n)] - f * n
        anchors = kept[~torch.isin(kept, salient)]
        assert anchors.numel() == 2 and int((anchors < 8).sum()) == 1, (f, kept.tolist())
