"""A restatement of PyramidDrop's released inference (Cooperx521/PyramidDrop,
`llava/model/modeling_llama_pdrop.py`, `LlamaModel.pdrop_forward` and `LlamaModel.pdrop_rank_drop`)
on a transformers Llama decoder, batch 1, no padding, written from that code and independent of
mipruner's layer loop: the layers run one by one; after layer `rank_layer - 1` the next layer's own
q/k (input_layernorm, q_proj, k_proj, rotary at the current position ids) give the last prompt
token's causal attention, softmax in float32, mean over heads, then over the image columns; the top
`int(N * ratio[s + 1])` image tokens stay, sorted back into sequence order, and the position ids
become arange(0, L'). Decoding: layer 0 sees the unpruned position (past length), and after each
rank layer the position drops by `int(N * ratio[s]) - int(N * ratio[s + 1])`. Grouped-query heads:
`repeat_kv` (head h reads KV head h // G; the release's matmul assumes H == KV)."""
from __future__ import annotations

import math
import sys

import torch


def _rope(attn):
    return sys.modules[type(attn).__module__].apply_rotary_pos_emb


def reference_pdrop(lm, head, embeds: torch.Tensor, image_index: int, n_image: int, layer_list: list[int],
                    ratio_list: list[float], max_new_tokens: int):
    """(last-row prefill logits (vocab,), greedy tokens, kept image indices per stage)."""
    from transformers import DynamicCache

    ratios = [1.0] + list(ratio_list)
    h, L = embeds, embeds.shape[1]
    pos = torch.arange(L)[None]
    cache = DynamicCache(config=lm.config)
    kept = []
    current = torch.arange(n_image)  # original image index of each image row present
    for idx, layer in enumerate(lm.layers):
        h = layer(h, attention_mask=None, position_embeddings=lm.rotary_emb(h, pos), position_ids=pos,
                  past_key_values=cache)
        h = h[0] if isinstance(h, tuple) else h
        rank_layer = idx + 1
        if rank_layer in layer_list:
            s = layer_list.index(rank_layer)
            cur, keep_len = int(n_image * ratios[s]), int(n_image * ratios[s + 1])
            block = lm.layers[rank_layer]
            attn = block.self_attn
            x = block.input_layernorm(h.clone().detach())
            q_len = x.shape[1]
            d = attn.head_dim
            q = attn.q_proj(x).view(1, q_len, -1, d).transpose(1, 2)
            k = attn.k_proj(x).view(1, q_len, -1, d).transpose(1, 2)
            cos, sin = lm.rotary_emb(x, pos)
            q, k = _rope(attn)(q, k, cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # repeat_kv
            last = q_len - 1  # prompt_total_len - 1: the last instruction token
            w = (q[0, :, last:last + 1] @ k[0].transpose(1, 2)) / math.sqrt(d)  # (H, 1, L); causal: row `last` sees all
            w = torch.softmax(w, dim=-1, dtype=torch.float32)
            avg = w.mean(0)[:, image_index:image_index + cur].mean(0)
            top = avg.topk(keep_len).indices.sort().values
            kept.append(current[top].clone())
            current = current[top]
            top = top + image_index
            h = torch.cat([h[:, :image_index], h[:, top], h[:, image_index + cur:]], dim=1)
            pos = torch.arange(h.shape[1])[None]
    logits = head(lm.norm(h))[0, -1].float()
    tokens = [int(logits.argmax())]
    embed = lm.embed_tokens
    for t in range(1, max_new_tokens):
        x = embed(torch.tensor([[tokens[-1]]]))
        p = torch.tensor([[L + t - 1]])
        for idx, layer in enumerate(lm.layers):
            x = layer(x, attention_mask=None, position_embeddings=lm.rotary_emb(x, p), position_ids=p,
                      past_key_values=cache)
            x = x[0] if isinstance(x, tuple) else x
            if idx + 1 in layer_list:
                s = layer_list.index(idx + 1)
                p = p - (int(n_image * ratios[s]) - int(n_image * ratios[s + 1]))
        tokens.append(int(head(lm.norm(x))[0, -1].argmax()))
    return logits, tokens, kept
