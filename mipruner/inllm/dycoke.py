"""DyCoke (Tao et al., "DyCoke: Dynamic Compression of Tokens for Fast Video Large Language Models", arXiv
2411.15024), both stages, on the public in-LLM API: a pre-LLM step (`run.at(0)`) and a decode-time stage
(`run.decode`).

Original: KD-TAO/DyCoke (`llava/model/llava_arch.py` `dycole_ttm`; `llava/model/language_model/
modeling_qwen2.py` `PrunableDynamicCache.dycoke_pruning` / `update_cache` and `Qwen2Model.forward`). The rules
are restated in `mipruner.pruners.dycoke`:

  stage 1, TTM    before the LLM, on the video's frame tokens (`frame_slots(run.frame_index, N_V)`: T frames
                  of P): frames paired and grouped in fours, each non-anchor frame keeps the int((1 - k) P)
                  tokens least like its anchor (k = dycoke_k, the release's 0.7); the others leave the
                  sequence, and the positions are renumbered (the release builds its sequence after merging:
                  positions 0..L'-1); tokens of no frame (OneVision's closing newline) stay;
  stage 2, DP     at every decoding step after the first token, the new token's head-mean attention at
                  layer l-1 (l = dycoke_l, the release's 3) over the span of visual tokens left (the release's
                  `image_token_length`: the merged tokens less the last one); when it is unlike the previous
                  step's (cosine < 0.9; the first step always), the layers from l on attend only to the top
                  int(S (1 - p)) of the span (p = dycoke_p, 0.7) at this step, else to every token. Masked in
                  the attention over the KV cache, not deleted (the release gathers the kept rows of its full
                  cache at each step: the same keys).

Budget: the method is adaptive, the budget its cap. dycoke_k = 0 (the default): the budget alone decides how
many tokens each pruned frame keeps (what the whole frames and the tokens of no frame leave of it, shared
evenly); dycoke_k > 0: int((1 - k) P), capped so; tokens still beyond the budget are trimmed, those of pruned
frames first. Keep-all: the budget N_V at dycoke_k = 0 keeps every token, and then DP keeps every token too
(decoding included): the unpruned model bit for bit. The fidelity options `dycoke_ties` and `dycoke_dtype` (`mipruner.pruners.dycoke`) choose the
release's `topk` tie order and its compute dtype (the default) or ours (stable, float32); on DP the dtype
casts the attention to the model's dtype before ranking (the release's softmax is cast back to it). DP's
decode layer is clamped to depth - 1 on a shallower decoder (`extras["decode_layer"]`).
"""
from __future__ import annotations

import torch

from ..pruners._registry import Param
from ..pruners.dycoke import DTYPES, TIES, check_option, dp_keep, pruned_frames, ttm_keep
from ..pruners.selection import Selection
from ..pruners.video import NotApplicable, frame_slots
from .api import DecoderRun, DecodeStep, register_inllm

PARAMS = (
    Param.real("dycoke_k", 0.0, 0.0, 1.0, "TTM's merging ratio k: a pruned frame keeps int((1 - k) P) of its P tokens, "
               "capped by the budget (DyCoke: 0.7; 0: the budget alone decides)", high_open=True, step=0.05, code="dk"),
    Param.real("dycoke_p", 0.7, 0.0, 1.0, "DP's pruning ratio p: a decoding step attends to int(S (1 - p)) of the S "
               "visual tokens when its attention moved (DyCoke: 0.7; 0 keeps all)", high_open=True, step=0.05,
               code="dp"),
    Param.integer("dycoke_l", 3, 1, None, "decoder layer l from which DP masks the visual keys (DyCoke: 3; clamped "
                  "to depth - 1)", code="dl"),
    Param.choice("dycoke_ties", "topk", TIES, "tie order: topk (the release's kernel order) or stable (lower index)",
                 code="dt"),
    Param.choice("dycoke_dtype", "model", DTYPES, "compute dtype: model (the release's, bf16/fp16 on a GPU) or "
                 "float32", code="dd"),
)


def _dp(span: torch.Tensor, prune_ratio: float, ties: str, dtype):
    """The decode-time stage: DP over the visual tokens `span` (S,) (indices into N_V)."""

    def stage(step: DecodeStep) -> torch.Tensor:
        att = step.attention().index_select(0, span)
        if dtype is not None:
            att = att.to(dtype)
        kept = dp_keep(att, step.memory.get("previous"), prune_ratio, ties=ties)
        step.memory["previous"] = att
        return step.present.clone().index_copy_(0, span, kept)

    return stage


@register_inllm("dycoke", label="DyCoke (video)", params=PARAMS, positions="renumber", adaptive=True,
                video=True, score_label="kept by TTM (1) or merged away (0)")
@torch.no_grad()
def dycoke(run: DecoderRun, budget: int, *, dycoke_k: float = 0.0, dycoke_p: float = 0.7, dycoke_l: int = 3,
           dycoke_ties: str = "topk", dycoke_dtype: str = "model") -> Selection:
    """DyCoke: temporal token merging before the LLM, then dynamic KV pruning at every decoding step."""
    ties, dt = check_option("dycoke_ties", dycoke_ties, TIES), check_option("dycoke_dtype", dycoke_dtype, DTYPES)
    view = run.at(0)
    vis = run.visual_positions
    dev = vis.device
    frames = frame_slots(run.frame_index, run.n_visual, dev)
    if frames.count < 2:
        raise NotApplicable("DyCoke merges tokens across frames: this input has 1 frame (an image or a 1-frame "
                            "video; Qwen makes one token-frame of 2 sampled frames); give it a video of more frames")
    x = view.hidden(vis)  # (N_V, d) the LLM's input embeddings of the visual tokens
    t, p = frames.count, frames.per_frame
    pruned = len(pruned_frames(t))
    room = (budget - int(frames.outside.numel()) - (t - pruned) * p) // max(pruned, 1)  # what the budget leaves
    count = max(0, min(p if dycoke_k == 0 else int((1 - float(dycoke_k)) * p), room))
    keep_tp = ttm_keep(x.index_select(0, frames.index.flatten()).view(t, p, -1), float(dycoke_k), ties=ties,
                       dtype=dt, count=count)
    whole = keep_tp.all(dim=1, keepdim=True).expand_as(keep_tp)  # tokens of frames kept whole rank first
    key = torch.full((run.n_visual,), 2, dtype=torch.long, device=dev)
    key.index_copy_(0, frames.index.flatten(), torch.where(keep_tp, 1 - whole.long(), torch.full_like(key[:1], 2)
                                                           .expand_as(keep_tp)).flatten())
    key.index_fill_(0, frames.outside, 0)
    order = torch.sort(key, stable=True).indices[:int((key < 2).sum())][:budget]  # one read: TTM's count
    kept = torch.sort(order).values
    run.keep(view, kept)
    span = kept[~torch.isin(kept, frames.outside)][:-1]  # the release's span: the merged tokens less the last
    layer = min(int(dycoke_l), run.n_layers - 1)
    p_dp = float(dycoke_p) if kept.numel() < run.n_visual else 0.0  # keep-all: every token, decoding included
    run.decode(layer, _dp(span, p_dp, ties, x.dtype if dt == "model" else None))
    scores = torch.zeros(run.n_visual, dtype=torch.float32, device=dev)
    scores[kept] = 1.0
    sel = Selection.from_order(kept, scores)
    sel.extras.update(decode_layer=layer, ttm_kept=keep_tp.cpu(), frames=frames.index.clone(), span=span.cpu(),
                      dycoke_k=float(dycoke_k), dycoke_p=float(dycoke_p))
    return sel


__all__ = ["PARAMS", "dycoke"]
