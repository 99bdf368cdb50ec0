"""Packed prefill: the rows of a batch run as ONE sequence, so that no row pays for another's padding.

A batch of pruned prompts (the unpruned reference and five pruned rows of one view: 591 and 5 x 79
tokens at LLaVA-1.5's shape) left-padded to its longest row makes the LLM process 6 x 591 rows in
the prefill. Packed, it processes the rows' own lengths summed, less what they share:

  * every row's tokens follow each other in one sequence (batch 1), with a block-diagonal causal
    mask: a token sees the earlier tokens of its own row only, and its position ids are its row's
    own (compact or original, Qwen's M-RoPE rows), so each row computes what it computes alone;
  * the prompt's text before the first visual token is the same in every row of one encoding (the
    same tokens at the same positions: pruning never touches it), so it runs once per encoding and
    the rows of that encoding attend to its keys and values (`shared` in `plan`). Causal attention
    makes that prefix's states independent of what follows, so sharing is exact.

The last token of every row gives the row's first logits (`logits_to_keep` = those indices). Decoding
then goes on in the packed cache itself on the plain path (`PackedSteps`: each step appends the B rows'
new tokens as B more positions, each seeing its own row), or, on the static/compiled path, the packed
cache's keys and values are gathered per row into the left-padded (B, W) static cache that its
compiled step reads (pad columns masked, as in the padded batch). What a row computes differs from its one-by-one
run only by float rounding (other matmul shapes), as the padded batch does (tests/models/
test_batch_*.py). With `bucket`, the packed length is padded to a multiple of it (pad tokens see
only each other) so that a compiled prefill sees a few shapes.

The masks are 4-D, which transformers' `create_causal_mask` takes as they are (boolean for SDPA,
additive otherwise). Layers with a sliding window would cut the packed sequence: `packable` says no.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ._decode_path import round_up

PAD_OWNER = -(1 << 40)  # the owner id of the packed sequence's trailing pad tokens


@dataclass
class Plan:
    """Where each row's tokens go in the packed sequence.

    pieces: (row, start, stop) slices of the rows' own token sequences, in packed order (a shared
    prefix is the slice [0, p) of its encoding's first row). total: packed length (bucketed);
    real: tokens before the pad. rows: per row, its packed token indices in order (L_i of them).
    width: the decoding cache's width W (the longest row, bucketed)."""

    pieces: list[tuple[int, int, int]]
    total: int
    real: int
    rows: list[list[int]]
    owner: list[int]
    group: list[int]
    width: int

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.rows]


def plan(lengths: list[int], groups: list, shared: list[int], bucket: int = 0) -> Plan:
    """The packed layout of rows of `lengths`; rows with the same `groups` key (their encoding) share
    their first `shared[i]` tokens (the text before the image; the smallest of the group is used and
    every row keeps at least one token of its own)."""
    keys: dict = {}
    for i, g in enumerate(groups):
        keys.setdefault(g, []).append(i)
    pieces, owner, group = [], [], []
    rows: list[list[int]] = [[] for _ in lengths]
    at = 0
    for gi, members in enumerate(keys.values()):
        p = min(min(shared[i] for i in members), min(lengths[i] for i in members) - 1) if len(members) > 1 else 0
        p = max(0, p)
        if p:
            pieces.append((members[0], 0, p))
            owner += [-1 - gi] * p
            group += [gi] * p
            for i in members:
                rows[i] += range(at, at + p)
            at += p
        for i in members:
            n = lengths[i] - p
            pieces.append((i, p, lengths[i]))
            owner += [i] * n
            group += [gi] * n
            rows[i] += range(at, at + n)
            at += n
    total = round_up(at, bucket)
    owner += [PAD_OWNER] * (total - at)
    group += [-1] * (total - at)
    return Plan(pieces=pieces, total=total, real=at, rows=rows, owner=owner, group=group,
                width=round_up(max(lengths), bucket))


def pack(plan_: Plan, rows: list[torch.Tensor], fill) -> torch.Tensor:
    """(total, ...) tensor: the rows' slices in packed order (rows: (L_i, ...) each; dim 0 = tokens),
    then `fill` up to the bucketed length."""
    parts = [rows[i][a:b] for i, a, b in plan_.pieces]
    pad = plan_.total - plan_.real
    if pad:
        first = rows[0]
        parts.append(torch.full((pad, *first.shape[1:]), fill, dtype=first.dtype, device=first.device))
    return torch.cat(parts, dim=0)


def packed_mask(plan_: Plan, device, dtype: torch.dtype, boolean: bool) -> torch.Tensor:
    """(1, 1, S, S): token a sees token b <= a of its own row, or of its encoding's shared prefix (pad
    tokens see the earlier pad tokens). Boolean (True = attend) for SDPA, else additive in `dtype`."""
    owner = torch.tensor(plan_.owner, dtype=torch.long, device=device)
    group = torch.tensor(plan_.group, dtype=torch.long, device=device)
    idx = torch.arange(plan_.total, device=device)
    causal = idx[None, :] <= idx[:, None]
    prefix = (owner < 0) & (owner != PAD_OWNER)
    seen = (owner[:, None] == owner[None, :]) | (prefix[None, :] & (group[:, None] == group[None, :]))
    allowed = (causal & seen)[None, None]
    if boolean:
        return allowed
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def gather_index(plan_: Plan, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B * W,) packed index of each cache slot of the left-padded (B, W) cache (a pad slot repeats its
    row's first token, masked anyway), the (B, W) long mask of real slots, and (B,) each row's last
    token in the packed sequence."""
    w = plan_.width
    idx, mask, last = [], [], []
    for r in plan_.rows:
        idx += [r[0]] * (w - len(r)) + r
        mask += [0] * (w - len(r)) + [1] * len(r)
        last.append(r[-1])
    b = len(plan_.rows)
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return as_long(idx), as_long(mask).view(b, w), as_long(last)


def row_sees(plan_: Plan, mask: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """(B, S) what each row's generated tokens see of the packed prefill: its last token's row of the
    4-D prefill `mask` (its own tokens and its encoding's shared prefix; pad tokens never)."""
    return mask[0, 0].index_select(0, last)


class PackedSteps:
    """The decoding steps of B rows on the packed prefill's own cache (no per-row copy of it): step n
    appends the rows' n-th tokens as B more positions of the one sequence; row i's token sees its
    row's prefill columns (`row_sees`) and its own earlier tokens (column S + B * m + i, m <= n).
    The cache then holds the rows' own tokens plus B per step, instead of B rows padded to the
    longest (6 x 591 positions at LLaVA-1.5's shape for one view), and nothing is gathered after
    the prefill. `next_mask()` is the (1, 1, B, S + B (n + 1)) mask of the next step n, boolean
    (SDPA) or additive in `dtype`; steps run in order."""

    def __init__(self, sees: torch.Tensor, boolean: bool, dtype: torch.dtype):
        self.allowed = sees if sees.dtype == torch.bool else sees == 0  # (B, S)
        self.eye = torch.eye(int(sees.shape[0]), dtype=torch.bool, device=sees.device)
        self.boolean, self.dtype = boolean, dtype

    def next_mask(self) -> torch.Tensor:
        self.allowed = torch.cat([self.allowed, self.eye], dim=1)
        allowed = self.allowed[None, None]
        if self.boolean:
            return allowed
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(self.dtype).min)


def packable(model, gen_config=None) -> bool:
    """False when the decoder has sliding-window layers (a packed sequence is longer than any row)."""
    text = model.config.get_text_config()
    types = getattr(text, "layer_types", None) or []
    return not any("sliding" in str(t) for t in types) and not getattr(text, "use_sliding_window", False)


def batched_cache(prefill_cache, index: torch.Tensor, n_rows: int, width: int, cache):
    """Write each layer's packed keys / values (1, H, S, D), gathered per row at `index` (B * W,), into
    `cache` (an empty DynamicCache or StaticCache) as its first W slots; returns `cache`."""
    for i, layer in enumerate(prefill_cache.layers):
        k, v = layer.keys[0], layer.values[0]  # (H, S, D)
        k = k.index_select(1, index).view(k.shape[0], n_rows, width, k.shape[-1]).transpose(0, 1)
        v = v.index_select(1, index).view(v.shape[0], n_rows, width, v.shape[-1]).transpose(0, 1)
        cache.update(k.contiguous(), v.contiguous(), i)
    return cache


def sdpa(model) -> bool:
    """Whether the text model attends through SDPA (boolean masks) rather than an additive mask."""
    return getattr(model.config.get_text_config(), "_attn_implementation", "sdpa") == "sdpa"


__all__ = ["COMPILE", "PackedSteps", "Plan", "batched_cache", "compiled", "gather_index", "greedy", "greedy_supported", "pack",
           "packable", "packed_mask", "plan", "row_sees", "sdpa", "static_cache", "STATIC_CACHES"]


# ----------------------------------------------------------------------------------------------
# greedy decoding after a packed prefill (the LLaVA family; Qwen keeps its own loop)

# generation-config fields that add logits processors in `generate`; a model whose config sets one
# answers through `generate` itself (`greedy_supported`)
_PROCESSOR_FIELDS = ("repetition_penalty", "encoder_repetition_penalty", "sequence_bias", "no_repeat_ngram_size",
                     "encoder_no_repeat_ngram_size", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
                     "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
                     "remove_invalid_values", "renormalize_logits", "min_length")
GREEDY_KWARGS = {"eos_token_id", "pad_token_id", "logits_processor", "min_new_tokens", "do_sample", "disable_compile"}


def greedy_supported(model, gen: dict) -> bool:
    """Whether `greedy` decodes exactly what `model.generate(do_sample=False, **gen)` would: only the
    arguments it implements, and no processor from the model's generation config."""
    if set(gen) - GREEDY_KWARGS or gen.get("do_sample"):
        return False
    cfg = model.generation_config
    for name in _PROCESSOR_FIELDS:
        v = getattr(cfg, name, None)
        if v not in (None, False, 0, 1.0, [], ()) or (name == "repetition_penalty" and v not in (None, 1.0)):
            return False
    return True


def greedy(step, first_logits: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, eos: list[int],
           procs: list, min_new_tokens: int = 0, pad_id: int = 0,
           slots: int | None = None) -> tuple[list[list[int]], float]:
    """Greedy tokens (B rows, up to `max_new_tokens`) after a prefill whose last-row logits are
    `first_logits` (B, V); `step(tokens (B,), mask (B, W + t))` runs one decoding step and returns
    its logits (B, V) (`mask` None: the step keeps its own mask, `PackedSteps`, and gets None). As `generate` does: EOS masked while fewer than `min_new_tokens` are out, the
    `procs` (callables (generated (B, t), scores (B, V)) -> scores) applied after, finished rows fed
    `pad_id`, one host sync a step (the stop check). `slots`: a static cache of that many slots, the
    mask then has its width from the start (zeros for slots not written yet: one shape every step,
    as `generate` gives its compiled step). Returns (token rows, time of the first token)."""
    import time

    n_rows = first_logits.shape[0]
    device = first_logits.device
    eos_t = torch.tensor(eos, dtype=torch.long, device=device)
    pad = torch.full((n_rows,), int(pad_id), dtype=torch.long, device=device)

    def pick(logits, tokens):
        scores = logits.float()
        if len(tokens) < min_new_tokens and eos:
            scores = scores.index_fill(-1, eos_t, float("-inf"))
        generated = torch.stack(tokens, 1) if tokens else torch.zeros(n_rows, 0, dtype=torch.long, device=device)
        for p in procs:
            scores = p(generated, scores)
        return scores.argmax(-1)

    token = pick(first_logits, [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first = time.perf_counter()
    tokens = [token]
    done = torch.isin(token, eos_t)
    width = 0 if mask is None else int(mask.shape[1])
    if slots is not None:
        mask = torch.cat([mask, mask.new_zeros(n_rows, slots - width)], dim=1)
    for n in range(1, int(max_new_tokens)):
        if eos and bool(done.all()):
            break
        if slots is not None:
            mask[:, width + n - 1] = 1  # the slot the previous token is written to
        elif mask is not None:
            mask = torch.cat([mask, mask.new_ones(n_rows, 1)], dim=1)
        logits = step(torch.where(done, pad, token), mask)
        token = torch.where(done, pad, pick(logits, tokens))
        tokens.append(token)
        done = done | torch.isin(token, eos_t)
    return torch.stack(tokens, 1).tolist(), first  # one transfer after the loop


# ----------------------------------------------------------------------------------------------
# the compiled path (`DecodePath(compile=True)`)

COMPILE = {"dynamic": False}  # torch.compile arguments of the compiled prefill and step (tests set a backend)


def compiled(adapter, name: str, fn):
    """`torch.compile(fn, **COMPILE)` kept on the adapter under `name` (one per model): the packed
    prefill and the decoding step. On CUDA with mode "reduce-overhead" (CUDA graphs: no launch
    overhead); each new shape (bucket, batch size) compiles once. Off CUDA `fn` itself, unless COMPILE
    names a backend."""
    if adapter.device.type != "cuda" and "backend" not in COMPILE:
        return fn  # as `generate` does: no compiling off CUDA unless a backend is named (tests)
    key = f"_compiled_{name}"
    held = getattr(adapter, key, None)
    if held is None or held[0] is not adapter.model:
        kw = dict(COMPILE)
        if adapter.device.type == "cuda" and "backend" not in kw:
            kw.setdefault("mode", "reduce-overhead")
        held = (adapter.model, torch.compile(fn, **kw))
        setattr(adapter, key, held)
    return held[1]


STATIC_CACHES = 3  # static caches kept per model: the app's view (B rows), its slider moves (B - 1), one answer


def static_cache(adapter, batch: int, length: int):
    """A StaticCache of `length` slots for `batch` rows, kept on the adapter and reset when its shape
    comes again, so that a compiled step sees the same buffers (a CUDA graph is recorded for buffers:
    new ones would record it again). The last STATIC_CACHES shapes are kept (least recently used
    dropped): the app alternates between a view's rows and a slider move's rows, each reusing its own."""
    from transformers import StaticCache

    held = getattr(adapter, "_packed_static_caches", None)
    if held is None:
        held = adapter._packed_static_caches = OrderedDict()
    key = (int(batch), int(length))
    cache = held.pop(key, None)
    if cache is not None:
        cache.reset()
    else:
        cache = StaticCache(config=adapter.model.config.get_text_config(), max_cache_len=length)
        while len(held) >= STATIC_CACHES:
            held.popitem(last=False)
    held[key] = cache  # the most recently used last
    return cache
