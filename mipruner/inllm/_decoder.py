"""Run the text decoder layer by layer, dropping visual tokens after layer K (FastV semantics).

Why a layer loop of our own, and why it is not intrusive: the in-LLM methods need to stop the
forward after layer K-1, read signals, and continue with fewer tokens. Instead of patching the
model's forward (what the originals do), we call the text decoder's PUBLIC submodules in the order
its own forward calls them: `rotary_emb` once, then `layers[i](hidden, attention_mask=...,
position_embeddings=..., position_ids=..., past_key_values=...)`, the Qwen3-VL deepstack addition
after the first layers, `norm`, and the output head. Masks come from transformers' own
`create_causal_mask` / `create_sliding_window_causal_mask`, sized per layer group through their
`layer_idx` argument; the KV cache is a stock `DynamicCache`. No method of any transformers class
is replaced and no state of the model is changed; the only hook (FastV/DART signal capture, in
`run_prefix`) is a forward pre-hook removed in a `finally`.

The continuation (`prefill` / `greedy`):
  layers 0..K-1  the full sequence (L tokens), positions as in the unpruned model;
  layers K..     only the kept rows (every text token + the kept visual tokens, L' of them), each
                 keeping its ORIGINAL position (the rotary cos/sin are gathered from the full
                 sequence's), a plain causal mask over the L' rows; Qwen3-VL deepstack features
                 are added in the remaining injected layers at the kept visual rows only;
  decoding       layers < K hold the full-length KV cache, layers >= K only the kept tokens'; the
                 new token sits at the unpruned next position in every layer.
With every token kept this performs the same operations on the same values as the model's own
forward / generate, so the logits are bit-identical (tested per family).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch

from ._prompt import Prompt


def layer_kind(config, i: int) -> str:
    """"sliding_attention" or "full_attention" for decoder layer i, as the model's forward decides."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[i]
    return "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"


def _mask(lm, kind: str, h: torch.Tensor, cache, layer_positions, layer_idx: int):
    """The model's own mask for queries `h` against the layer group starting at `layer_idx`."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kv_len = h.shape[1] + (cache.get_seq_length(layer_idx) if cache is not None else 0)
    ones = torch.ones(1, kv_len, dtype=torch.long, device=h.device)  # no padding (batch 1)
    fn = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
    return fn(config=lm.config, inputs_embeds=h, attention_mask=ones, past_key_values=cache,
              position_ids=layer_positions, layer_idx=layer_idx)


def run_layers(prompt: Prompt, h: torch.Tensor, layers: range, position_embeddings, layer_positions,
               cache=None, deepstack_rows: torch.Tensor | None = None,
               deepstack: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Decoder layers `layers` on hidden states h (1, q, d); returns the new hidden states.

    deepstack_rows: (n,) row indices of h that are visual tokens; deepstack: per layer i, (n, d)
    features added to those rows after layer i (Qwen3-VL), already restricted to the kept tokens.
    """
    lm = prompt.lm
    masks: dict[str, object] = {}
    for i in layers:
        kind = layer_kind(lm.config, i)
        if kind not in masks:  # built before the group's first layer of this kind touches the cache
            masks[kind] = _mask(lm, kind, h, cache, layer_positions, i)
        out = lm.layers[i](h, attention_mask=masks[kind], position_embeddings=position_embeddings,
                           position_ids=layer_positions, past_key_values=cache)
        h = out[0] if isinstance(out, tuple) else out
        if deepstack is not None and i < len(deepstack):
            h = h.clone()
            h[0, deepstack_rows] = h[0, deepstack_rows] + deepstack[i]
    return h


def gather_positions(position_embeddings, rows: torch.Tensor):
    """cos/sin (..., L, d_head) of the full sequence -> those of `rows` (their original positions)."""
    return tuple(x.index_select(-2, rows) for x in position_embeddings)


@dataclass
class Prefix:
    """The full sequence after layers 0..K-1: the input of layer K and what was read on the way.

    hidden: (1, L, d) input of layer K. position_embeddings: the full sequence's cos/sin.
    kv: per layer < K, its (keys, values) of the L tokens (None when run without a cache).
    last_attention: (L,) float32 head-mean attention of the last prompt token at layer K-1 (FastV).
    key_l1: (L,) float32 L1 norm of each token's layer K-1 keys, heads concatenated (DART).
    """

    layer: int
    hidden: torch.Tensor
    position_embeddings: tuple
    kv: list | None = None
    last_attention: torch.Tensor | None = None
    key_l1: torch.Tensor | None = None


def _full_deepstack(prompt: Prompt):
    return (prompt.visual_positions, prompt.deepstack) if prompt.deepstack is not None else (None, None)


def run_prefix(prompt: Prompt, layer: int, *, cache=None, capture: bool = False) -> Prefix:
    """Layers 0..layer-1 on the full sequence.

    With `capture` (needs `cache`, a DynamicCache): also the FastV attention and DART key norms of
    layer `layer`-1, read from the layer's attention input (a forward pre-hook, removed on exit,
    that ignores calls from other threads sharing the model) and from the keys it wrote into the
    cache.
    """
    h = prompt.embeds
    pe = prompt.lm.rotary_emb(h, prompt.rope_positions)  # (cos, sin), once for the full sequence
    rows, ds = _full_deepstack(prompt)
    seen: dict = {}
    handle = None
    if capture:
        if cache is None:
            raise ValueError("capture needs a KV cache")
        attn = prompt.lm.layers[layer - 1].self_attn
        me = threading.get_ident()

        def pre_hook(_module, args, kwargs):
            if threading.get_ident() != me:  # another request running the same model meanwhile
                return
            x = args[0] if args else kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]
            seen["query_input"] = x[:, -1:]  # (1, 1, d): the last prompt token, after the input norm
            seen["cos_sin"] = (cos[..., -1:, :], sin[..., -1:, :])

        handle = attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        h = run_layers(prompt, h, range(layer), pe, prompt.layer_positions, cache, rows, ds)
    finally:
        if handle is not None:
            handle.remove()
    prefix = Prefix(layer=layer, hidden=h, position_embeddings=pe)
    if cache is not None:
        prefix.kv = [(cache.layers[i].keys, cache.layers[i].values) for i in range(layer)]
    if capture:
        from .fastv import last_token_attention

        keys = cache.layers[layer - 1].keys  # (1, KV, L, d_head): post-norm, post-rotary
        attn = prompt.lm.layers[layer - 1].self_attn
        window = getattr(prompt.lm.config, "sliding_window", None) \
            if layer_kind(prompt.lm.config, layer - 1) == "sliding_attention" else None
        prefix.last_attention = last_token_attention(attn, seen["query_input"], seen["cos_sin"], keys, window)
        prefix.key_l1 = keys[0].float().abs().sum(dim=(0, 2))  # sum over heads and d_head -> (L,)
    return prefix


def continue_prefix(prompt: Prompt, prefix: Prefix, rows: torch.Tensor, keep: torch.Tensor | None,
                    cache=None) -> torch.Tensor:
    """Layers K.. on the kept rows (`rows` = `prompt.kept_sequence(keep)`); returns (1, L', d)."""
    h = prefix.hidden.index_select(1, rows)
    pe = gather_positions(prefix.position_embeddings, rows)
    layer_pos = None if prompt.layer_positions is None else prompt.layer_positions.index_select(1, rows)
    ds_rows = ds = None
    if prompt.deepstack is not None:
        kept_vis = torch.arange(prompt.visual_positions.numel(), device=rows.device) if keep is None \
            else keep.to(rows.device)
        # where the kept visual tokens sit in the kept sequence (rows is ascending)
        ds_rows = torch.searchsorted(rows, prompt.visual_positions[kept_vis])
        ds = [f.index_select(0, kept_vis) for f in prompt.deepstack]
    return run_layers(prompt, h, range(prefix.layer, prompt.n_layers), pe, layer_pos, cache, ds_rows, ds)


def logits_of(prompt: Prompt, h: torch.Tensor, last_only: bool = False) -> torch.Tensor:
    """Final norm + head, as the model's forward: norm over all rows, head over all or the last."""
    h = prompt.lm.norm(h)
    return prompt.head(h[:, -1:] if last_only else h)


def prefill_cache(prompt: Prompt, prefix: Prefix):
    """A fresh DynamicCache whose layers < K hold the prefix's KV (copied by reference: the cache
    concatenates on update, so the prefix's tensors are never modified)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=prompt.lm.config)
    for i, (k, v) in enumerate(prefix.kv):
        cache.update(k, v, i)
    return cache


def greedy(prompt: Prompt, prefix: Prefix, cache, rows: torch.Tensor, keep: torch.Tensor | None,
           max_new_tokens: int, min_new_tokens: int = 0, on_first: Callable[[], None] | None = None) -> list[int]:
    """Greedy decoding after the pruned prefill. `cache` holds layers < K of the prefix already."""
    embed = prompt.lm.embed_tokens
    h = continue_prefix(prompt, prefix, rows, keep, cache)
    logits = logits_of(prompt, h, last_only=True)[0, -1]
    eos = list(prompt.eos)

    def pick(step: int, logits: torch.Tensor) -> int:
        if step < min_new_tokens and eos:
            logits = logits.clone()
            logits[eos] = -float("inf")
        return int(logits.argmax())

    token = pick(0, logits)
    if on_first is not None:
        on_first()
    out = [token]
    device = prompt.embeds.device
    for step in range(1, max_new_tokens):
        if token in prompt.eos:  # `pick` never returns EOS before min_new_tokens
            break
        x = embed(torch.tensor([[token]], device=device))  # (1, 1, d)
        rope, layer_pos = prompt.step_positions(prompt.next_position + step - 1)
        pe = prompt.lm.rotary_emb(x, rope)
        # two groups, each with masks sized against its own cache (full length below K, kept above)
        x = run_layers(prompt, x, range(prefix.layer), pe, layer_pos, cache)
        x = run_layers(prompt, x, range(prefix.layer, prompt.n_layers), pe, layer_pos, cache)
        token = pick(step, logits_of(prompt, x, last_only=True)[0, -1])
        out.append(token)
    return out
