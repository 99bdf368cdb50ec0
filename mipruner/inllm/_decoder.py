"""Run the text decoder layer by layer, dropping visual tokens after layer K (FastV semantics), or
at several layers in turn (a schedule of `Stage`s: SparseVLM).

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

The continuation (`continue_prefix`, `_greedy.greedy`):
  layers 0..K-1  the full sequence (L tokens), positions as in the unpruned model;
  layers K..     only the kept rows (every text token + the kept visual tokens, L' of them), each
                 keeping its ORIGINAL position (the rotary cos/sin are gathered from the full
                 sequence's), a plain causal mask over the L' rows; Qwen3-VL deepstack features
                 are added in the remaining injected layers at the kept visual rows only;
  decoding       layers < K hold the full-length KV cache, layers >= K only the kept tokens'; the
                 new token sits at the unpruned next position in every layer.
With every token kept this performs the same operations on the same values as the model's own
forward / generate, so the logits are bit-identical (tested per family).

Several stages (`Stage`, `advance`, `apply_stage`, `run_staged`): the same, once per stage. Stage s
says which rows remain from its layer K_s on (a subset of the rows before it) and, optionally,
which of those rows enter K_s holding the mean of other rows' hidden states (merged tokens, in the
slot of a dropped row, at that row's position). Layer group [K_s, K_s+1) runs on stage s's rows
and holds their KV; decoding (`_greedy.greedy`) runs each group against its own cache. One stage at K
is FastV.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from ._probe import last_token_attention
from ._prompt import Prompt


def layer_kind(config, i: int) -> str:
    """"sliding_attention" or "full_attention" for decoder layer i, as the model's forward decides."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[i]
    return "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"


def _mask(lm, kind: str, h: torch.Tensor, cache, layer_positions, layer_idx: int, key_mask=None):
    """The model's own mask for queries `h` against the layer group starting at `layer_idx`; key_mask
    (kv_len,) bool: the cache positions attended (a decode-time stage's, passed as the public 2-D
    attention mask), None: every one."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kv_len = h.shape[1] + (cache.get_seq_length(layer_idx) if cache is not None else 0)
    ones = torch.ones(1, kv_len, dtype=torch.long, device=h.device) if key_mask is None \
        else key_mask.to(torch.long)[None]  # no padding (batch 1)
    fn = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
    return fn(config=lm.config, inputs_embeds=h, attention_mask=ones, past_key_values=cache,
              position_ids=layer_positions, layer_idx=layer_idx)


def run_layers(prompt: Prompt, h: torch.Tensor, layers: range, position_embeddings, layer_positions,
               cache=None, deepstack_rows: torch.Tensor | None = None,
               deepstack: list[torch.Tensor] | None = None, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Decoder layers `layers` on hidden states h (1, q, d); returns the new hidden states.

    deepstack_rows: (n,) row indices of h that are visual tokens; deepstack: per layer i, (n, d)
    features added to those rows after layer i (Qwen3-VL), already restricted to the kept tokens.
    key_mask: (kv_len,) bool cache positions the queries attend to (`_mask`), None: all.
    """
    lm = prompt.lm
    masks: dict[str, object] = {}
    for i in layers:
        kind = layer_kind(lm.config, i)
        if kind not in masks:  # built before the group's first layer of this kind touches the cache
            masks[kind] = _mask(lm, kind, h, cache, layer_positions, i, key_mask)
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
    rows: (L_K,) ascending sequence indices that `hidden` holds (None: all L; staged runs).
    stages: the `Stage`s applied so far (their layers bound the decoding's layer groups).
    probe: what `advance(..., probe=)` read at layer K-1 (see there), else None.
    """

    layer: int
    hidden: torch.Tensor
    position_embeddings: tuple
    kv: list | None = None
    last_attention: torch.Tensor | None = None
    key_l1: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    stages: tuple = ()
    probe: dict | None = None
    memo: dict = field(default_factory=dict)  # per-prefix derived tensors (e.g. the normed hidden states)

    @property
    def renumbered(self) -> bool:
        return bool(self.stages) and self.stages[-1].renumber


@dataclass(frozen=True)
class Stage:
    """From decoder layer `layer` on, only `rows` remain: (L_s,) ascending sequence indices, a subset
    of the rows present before. Merged tokens (optional): the hidden state entering `layer` at
    merge_rows (M,) (sequence indices among `rows`) becomes the mean of the hidden states entering
    `layer` at merge_members (P,) (rows present before), member p going to merge token merge_of[p]
    (in [0, M)). Every row keeps its original position (a merged row that of its slot), or, with
    `renumber`, moves down by the number of rows dropped before it (`shifted_positions`)."""

    layer: int
    rows: torch.Tensor
    merge_rows: torch.Tensor | None = None
    merge_members: torch.Tensor | None = None
    merge_of: torch.Tensor | None = None
    renumber: bool = False


def _full_deepstack(prompt: Prompt):
    return (prompt.visual_positions, prompt.deepstack) if prompt.deepstack is not None else (None, None)


def start(prompt: Prompt) -> Prefix:
    """The input of layer 0: the full prompt's embeddings and rotary cos/sin (no layer run yet)."""
    h = prompt.embeds
    pe = prompt.lm.rotary_emb(h, prompt.rope_positions)  # (cos, sin), once for the full sequence
    return Prefix(layer=0, hidden=h, position_embeddings=pe, kv=[])


def shifted_positions(prompt: Prompt, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rope positions, layer positions) of `rows` renumbered: each row's original position minus
    the number of rows dropped before it (row j of the ascending `rows` sits at sequence index
    rows[j], so rows[j] - j were dropped before it). 1-D positions 0..L-1 become 0..L'-1 (PyramidDrop's
    `arange`); M-RoPE's components move together."""
    shift = rows - torch.arange(rows.numel(), device=rows.device)
    rope = prompt.rope_positions.index_select(-1, rows) - shift
    layer = None if prompt.layer_positions is None else prompt.layer_positions.index_select(1, rows) - shift[None]
    return rope, layer


def _row_inputs(prompt: Prompt, rows: torch.Tensor | None, pe, renumber: bool = False):
    """(cos/sin, layer positions, deepstack rows, deepstack features) of the rows `rows` (None: all):
    each row at its original position (or renumbered, `shifted_positions`, when a row was dropped);
    deepstack features at the visual rows present (a merged row receives those of its slot, as the
    model's own forward would there)."""
    if rows is None:
        ds_rows, ds = _full_deepstack(prompt)
        return pe, prompt.layer_positions, ds_rows, ds
    if renumber and rows.numel() < prompt.length:
        rope, layer_pos = shifted_positions(prompt, rows)
        pe_rows = prompt.lm.rotary_emb(prompt.embeds, rope)
    else:
        layer_pos = None if prompt.layer_positions is None else prompt.layer_positions.index_select(1, rows)
        pe_rows = gather_positions(pe, rows)
    ds_rows = ds = None
    if prompt.deepstack is not None:
        vis = prompt.visual_positions
        lookup = torch.full((prompt.length,), -1, dtype=torch.long, device=rows.device)
        lookup[vis] = torch.arange(vis.numel(), device=rows.device)
        which = lookup.index_select(0, rows)  # visual index of each row, -1 for text
        ds_rows = torch.nonzero(which >= 0).flatten()  # where the visual rows sit among `rows`
        ds = [f.index_select(0, which.index_select(0, ds_rows)) for f in prompt.deepstack]
    return pe_rows, layer_pos, ds_rows, ds


def row_inputs(prompt: Prompt, prefix: "Prefix"):
    """`_row_inputs` of the prefix's rows under its latest stage's position rule."""
    return _row_inputs(prompt, prefix.rows, prefix.position_embeddings, prefix.renumbered)


def advance(prompt: Prompt, prefix: Prefix, layer: int, *, cache=None, probe: torch.Tensor | None = None) -> Prefix:
    """Layers prefix.layer..layer-1 on the prefix's rows; returns the input of layer `layer`.

    cache: a DynamicCache holding the layers < prefix.layer (e.g. `prefill_cache(prompt, prefix)`),
    or None (no KV kept). probe: (R,) indices into the current rows (needs `cache`): the attention
    input of those rows at layer `layer`-1 and their cos/sin are read (a forward pre-hook, removed on
    exit, that ignores calls from other threads sharing the model), with the keys that layer wrote
    into the cache: prefix.probe = {query_input (1, R, d), cos_sin, keys (1, KV, L_cur, d_head),
    query_index (R,), window (the layer's sliding window or None)}.
    """
    if probe is not None and cache is None:
        raise ValueError("probe needs a KV cache")
    pe, layer_pos, ds_rows, ds = row_inputs(prompt, prefix)
    every = isinstance(probe, str)
    if every and probe != "all":
        raise ValueError(f"probe must be row indices or 'all', got {probe!r}")
    seen: dict = {}
    handle = None
    if probe is not None:
        attn = prompt.lm.layers[layer - 1].self_attn
        me = threading.get_ident()

        def pre_hook(_module, args, kwargs):
            if threading.get_ident() != me:  # another request running the same model meanwhile
                return
            x = args[0] if args else kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]
            if every:  # every row: the reader index_selects its queries later (the same values)
                seen["query_input"], seen["cos_sin"] = x, (cos, sin)
                return
            seen["query_input"] = x.index_select(1, probe)  # after the layer's input norm
            seen["cos_sin"] = (cos.index_select(-2, probe), sin.index_select(-2, probe))

        handle = attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        h = run_layers(prompt, prefix.hidden, range(prefix.layer, layer), pe, layer_pos, cache, ds_rows, ds)
    finally:
        if handle is not None:
            handle.remove()
    kv = None
    if cache is not None:
        kv = list(prefix.kv or []) + [(cache.layers[i].keys, cache.layers[i].values)
                                      for i in range(prefix.layer, layer)]
    out = Prefix(layer=layer, hidden=h, position_embeddings=prefix.position_embeddings, kv=kv, rows=prefix.rows,
                 stages=prefix.stages)
    if probe is not None:
        window = getattr(prompt.lm.config, "sliding_window", None) \
            if layer_kind(prompt.lm.config, layer - 1) == "sliding_attention" else None
        out.probe = dict(seen, keys=cache.layers[layer - 1].keys, query_index=None if every else probe, window=window)
    return out


def apply_stage(prompt: Prompt, prefix: Prefix, stage: Stage) -> Prefix:
    """The input of layer `stage.layer` restricted to stage.rows, with its merged rows filled in."""
    if stage.layer != prefix.layer:
        raise ValueError(f"a stage at layer {stage.layer} applied to the input of layer {prefix.layer}")
    device = prefix.hidden.device
    rows = stage.rows.to(device)

    def at(r: torch.Tensor) -> torch.Tensor:  # where sequence rows r sit among the prefix's rows
        return r if prefix.rows is None else torch.searchsorted(prefix.rows, r)

    h = prefix.hidden.index_select(1, at(rows))
    if stage.merge_rows is not None and stage.merge_rows.numel():
        merge_rows, members, of = (t.to(device) for t in (stage.merge_rows, stage.merge_members, stage.merge_of))
        perm = torch.argsort(members)  # one order whatever the listing: the same sums, bit for bit
        x = prefix.hidden[0].index_select(0, at(members[perm])).float()  # (P, d)
        m = merge_rows.numel()
        w = (of[perm][None, :] == torch.arange(m, device=device)[:, None]).float()  # (M, P)
        merged = (w / w.sum(dim=1, keepdim=True)) @ x  # (M, d): each merged token the mean of its members
        h[0, torch.searchsorted(rows, merge_rows)] = merged.to(h.dtype)
    return Prefix(layer=prefix.layer, hidden=h, position_embeddings=prefix.position_embeddings, kv=prefix.kv,
                  rows=rows, stages=prefix.stages + (stage,))


def run_staged(prompt: Prompt, stages, *, cache=None) -> Prefix:
    """Layers 0..K_last-1 under the schedule `stages` (ascending layers): the input of layer K_last
    on the last stage's rows. cache: an empty DynamicCache to fill, or None."""
    prefix = start(prompt)
    if cache is None:
        prefix.kv = None
    for stage in stages:
        prefix = apply_stage(prompt, advance(prompt, prefix, stage.layer, cache=cache), stage)
    return prefix


def run_prefix(prompt: Prompt, layer: int, *, cache=None, capture: bool = False) -> Prefix:
    """Layers 0..layer-1 on the full sequence.

    With `capture` (needs `cache`, a DynamicCache): also the FastV attention and DART key norms of
    layer `layer`-1, read from the layer's attention input of the last prompt token (`advance`'s
    probe) and from the keys it wrote into the cache.
    """
    if capture and cache is None:
        raise ValueError("capture needs a KV cache")
    last = torch.tensor([prompt.length - 1], device=prompt.embeds.device) if capture else None
    prefix = start(prompt)
    if cache is None:
        prefix.kv = None
    prefix = advance(prompt, prefix, layer, cache=cache, probe=last)
    if capture:
        probe, prefix.probe = prefix.probe, None
        keys = probe["keys"]  # (1, KV, L, d_head): post-norm, post-rotary
        attn = prompt.lm.layers[layer - 1].self_attn
        prefix.last_attention = last_token_attention(attn, probe["query_input"], probe["cos_sin"], keys,
                                                     probe["window"])
        prefix.key_l1 = keys[0].float().abs().sum(dim=(0, 2))  # sum over heads and d_head -> (L,)
    return prefix


def continue_prefix(prompt: Prompt, prefix: Prefix, rows: torch.Tensor | None, keep: torch.Tensor | None = None,
                    cache=None) -> torch.Tensor:
    """Layers K.. to the last; returns their output (1, L', d).

    rows: `prompt.kept_sequence(keep)`, the rows that remain from layer K on (one more stage at K),
    or None when the prefix is already staged (`run_staged`). `keep` is not read (the visual rows
    are found from `rows`); it stays for the callers.
    """
    if rows is not None:
        prefix = apply_stage(prompt, prefix, Stage(prefix.layer, rows))
    pe, layer_pos, ds_rows, ds = row_inputs(prompt, prefix)
    return run_layers(prompt, prefix.hidden, range(prefix.layer, prompt.n_layers), pe, layer_pos, cache, ds_rows, ds)


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
