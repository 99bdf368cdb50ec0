"""A restatement of DyCoke's released inference (KD-TAO/DyCoke), written from that code and independent of
mipruner's layer loop and of `mipruner.pruners.dycoke`:

  TTM   `llava/model/llava_arch.py` `dycole_ttm`, literally: the frames' tokens flattened (T P, d), the pair
        loop (normalize, cosine_similarity, `similarities[(i - 2) // 2]`, `topk(largest=False)`) and the
        group-of-four loop (plain cosine, `odd_similarities[i // 4]`), returning each frame's kept slots in
        the release's (topk) order. The release's two failures are not restated: an odd last frame, which it
        leaves out of the video, is kept whole here, and T <= 4 skips the group-of-four loop (its
        `torch.stack([])` raises). `ties="stable"` / float32 are our options (the sort the method offers).
  DP    `modeling_qwen2.py` `Qwen2Model.forward` with `PrunableDynamicCache`: on each one-token step, layers
        < l see the whole cache; the attention of the new token at layer l-1 (input_layernorm, q_proj,
        rotary, the cached keys, repeat_kv, softmax in float32, mean over heads) over the span of visual
        tokens (the merged tokens less the last); cosine with the previous step's; below 0.9 (or at the
        first step) the layers >= l see the text, the top int(S (1 - p)) span tokens and the rest (here
        an additive -inf mask on the others, the release gathers the kept rows: the same keys), else all.

The sequence: text rows and the kept visual rows in sequence order, positions renumbered (the release
builds its sequence after merging), decoding at the shortened length. Layers are called as modules on a
stock DynamicCache, `attention_mask=None` at prefill (causal) and at unmasked steps, as the release.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def released_ttm(feature: torch.Tensor, per_frame: int, merging_ratio: float, *, ties: str = "topk"):
    """(kept slots per frame, in the release's order) of `feature` (T P, d)."""
    def lowest(s, k):
        if ties == "topk":
            return s.topk(k, largest=False).indices
        return torch.sort(s, stable=True).indices[:k]

    n_frames = feature.shape[0] // per_frame
    keep_ratio = 1 - merging_ratio
    frame = [feature[i * per_frame:(i + 1) * per_frame] for i in range(n_frames)]
    sims = []
    for i in range(0, n_frames - 1, 2):
        sims.append(F.cosine_similarity(F.normalize(frame[i], p=2, dim=1), F.normalize(frame[i + 1], p=2, dim=1),
                                        dim=1))
    kept = [torch.arange(per_frame) for _ in range(n_frames)]  # an odd last frame: whole (see the docstring)
    for i in range(0, n_frames - 1, 2):
        avg = sims[(i - 2) // 2]
        kept[i] = torch.arange(per_frame)
        kept[i + 1] = lowest(avg, int(keep_ratio * per_frame))
    if n_frames > 4:
        odd = [F.cosine_similarity(frame[i], frame[i + 2], dim=1) for i in range(0, n_frames - 4, 4)]
        for i in range(0, n_frames - 4, 4):
            kept[i] = torch.arange(per_frame)
            kept[i + 2] = lowest(odd[i // 4], int(keep_ratio * per_frame))
    return kept


def _rope(attn):
    return sys.modules[type(attn).__module__].apply_rotary_pos_emb


def released_dp_attention(block, x: torch.Tensor, pe, keys: torch.Tensor) -> torch.Tensor:
    """(kv,) the head-mean attention of the one query x (1, 1, d) entering `block` over `keys`."""
    attn = block.self_attn
    h = block.input_layernorm(x)
    d = keys.shape[-1]
    q = attn.q_proj(h).view(1, 1, -1, d)
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
    q = q.transpose(1, 2)
    cos, sin = pe
    q, _ = _rope(attn)(q, q, cos, sin)
    k = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
    w = torch.softmax((q.float() @ k.float().transpose(2, 3)) * float(attn.scaling), dim=-1, dtype=torch.float32)
    return w.mean(1)[0, -1]


def released_dycoke(prompt, kept_visual: torch.Tensor, span: torch.Tensor, layer_l: int, prune_ratio: float,
                    max_new_tokens: int, *, ties: str = "topk"):
    """(prefill logits of the last row (vocab,), greedy tokens, per step the (N_V,) bool visual tokens the
    layers >= l attend to) on the `prompt` (`mipruner.inllm._prompt.Prompt`) pruned to the visual tokens
    `kept_visual` (indices into N_V), DP over the visual tokens `span`."""
    from transformers import DynamicCache

    lm, vis, L = prompt.lm, prompt.visual_positions, prompt.length
    keep = torch.ones(L, dtype=torch.bool)
    keep[vis] = False
    keep[vis[kept_visual]] = True
    rows = torch.nonzero(keep).flatten()
    shift = rows - torch.arange(rows.numel())
    rope = prompt.rope_positions[..., rows] - shift
    layer_pos = None if prompt.layer_positions is None else prompt.layer_positions[:, rows] - shift[None]
    h = prompt.embeds[:, rows]
    ds_rows = torch.nonzero(torch.isin(rows, vis[kept_visual])).flatten()
    ds = None if prompt.deepstack is None else [f[kept_visual] for f in prompt.deepstack]
    cache = DynamicCache(config=lm.config)
    pe = lm.rotary_emb(h, rope)
    for i, layer in enumerate(lm.layers):
        h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=layer_pos, past_key_values=cache)
        h = h[0] if isinstance(h, tuple) else h
        if ds is not None and i < len(ds):
            h = h.clone()
            h[0, ds_rows] = h[0, ds_rows] + ds[i]
    logits = prompt.head(lm.norm(h))[0, -1].float()
    tokens = [int(logits.argmax())]
    col = torch.searchsorted(rows, vis[span])  # the span's cache columns
    previous, masks = None, []
    dropped = L - rows.numel()
    for t in range(1, max_new_tokens):
        if tokens[-1] in prompt.eos:
            break
        x = lm.embed_tokens(torch.tensor([[tokens[-1]]]))
        pos = prompt.next_position + t - 1 - dropped
        r = torch.full((*prompt.rope_positions.shape[:-1], 1), pos, dtype=torch.long)
        lp = None if prompt.layer_positions is None else r.view(1, 1)
        pe = lm.rotary_emb(x, r)
        mask = None
        attended = torch.zeros(vis.numel(), dtype=torch.bool)
        attended[kept_visual] = True
        for i, layer in enumerate(lm.layers):
            if i == layer_l:
                att = released_dp_attention(lm.layers[i - 1], seen, pe, cache.layers[i - 1].keys)[col]
                sim = 0.0 if previous is None else float(F.cosine_similarity(att, previous, dim=0))
                previous = att
                if sim < 0.9:
                    k = int(att.numel() * (1 - prune_ratio))
                    top = att.topk(k).indices if ties == "topk" else torch.sort(att, descending=True,
                                                                                stable=True).indices[:k]
                    hide = torch.ones(att.numel(), dtype=torch.bool)
                    hide[top] = False
                    kv = rows.numel() + t
                    mask = torch.zeros(1, 1, 1, kv, dtype=x.dtype)
                    mask[..., col[hide]] = float("-inf")
                    attended[span[hide]] = False
            if i == layer_l - 1:
                seen = x
            x = layer(x, attention_mask=mask, position_embeddings=pe, position_ids=lp, past_key_values=cache)
            x = x[0] if isinstance(x, tuple) else x
        masks.append(attended)
        tokens.append(int(prompt.head(lm.norm(x))[0, -1].argmax()))
    return logits, tokens, masks
