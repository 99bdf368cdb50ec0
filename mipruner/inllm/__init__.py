"""In-LLM comparison pruners: FastV and DART drop visual tokens INSIDE the language model.

Unlike the pruners of `mipruner.pruners` (which select before the LLM, from the encoding alone),
these read signals from the first K decoder layers run on the full prompt, then continue from
layer K with the kept tokens only (`_decoder.py` explains how, without touching transformers
classes). The API mirrors the rest of the library:

    sel = inllm.select(adapter, enc, "fastv", 64, cache=c)     # runs layers 0..K-1 once per (enc, K)
    sel = inllm.select(adapter, enc, "fastv", 0.25, cache=c)   # another budget: re-rank only
    ans = inllm.generate(adapter, enc, sel, layer=sel.extras["layer"], cache=c)
    logits = inllm.prefill_logits(adapter, enc, sel, layer=2)

`sel.keep` indexes the N_V visual tokens of `enc` like every Selection, so masks can be drawn.
Parameters (defaults: `defaults(name)`):
  fastv  layer=2         K: prune after layer K-1's attention (FastV paper: K=2, R=50%)
  dart   layer=2         K: pivots from layer K-1's keys, similarity at layer K's input (DART: K=2)
         image_pivots=4  image pivot tokens (DART: 4)
         text_pivots=4   text pivot tokens, from the tokens after the last image token (DART: 4)
`layer` must lie in [1, number of decoder layers]; at K = number of layers no layer ever sees the
pruned sequence, so the answer is the unpruned one (only fewer prompt rows get logits).

Supported families: LLaVA-1.5, LLaVA-NeXT, Video-LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen3-VL; other
adapters raise NotImplementedError.
"""
from __future__ import annotations

import difflib
import numbers
import time
from typing import Any

import torch

from ..models.base import Answer, Encoded, keep_indices
from ..pruners.selection import Selection, resolve_budget

METHODS: tuple[str, ...] = ("fastv", "dart")

_DEFAULTS: dict[str, dict[str, Any]] = {
    "fastv": {"layer": 2},  # FastV: K = 2 (R = 50% is the budget)
    "dart": {"layer": 2, "image_pivots": 4, "text_pivots": 4},  # DART: K = 2, 4 + 4 pivots
}


def is_in_llm(name: str) -> bool:
    """True for the methods this package runs inside the LLM ("fastv", "dart")."""
    return name in METHODS


def _check_method(method: str) -> str:
    if not isinstance(method, str) or method not in METHODS:
        close = difflib.get_close_matches(str(method), list(METHODS), n=2)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown in-LLM method ({method!r}).{hint} Known: {', '.join(METHODS)}")
    return method


def defaults(name: str) -> dict:
    """The parameters of in-LLM method `name` with their defaults (a fresh dict)."""
    return dict(_DEFAULTS[_check_method(name)])


def _int(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return v


def _params(method: str, params: dict) -> dict:
    allowed = _DEFAULTS[method]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(f"{method!r} got unknown keyword argument(s) {unknown}; it accepts {sorted(allowed)}")
    p = {**allowed, **params}
    if method == "dart":
        p["image_pivots"] = _int("image_pivots", p["image_pivots"], 0)
        p["text_pivots"] = _int("text_pivots", p["text_pivots"], 0)
        if p["image_pivots"] + p["text_pivots"] < 1:
            raise ValueError("image_pivots + text_pivots must be >= 1, got 0")
    return p


def _get_prompt(adapter, encoded: Encoded, cache: dict | None):
    from ._prompt import prompt_of

    if cache is None:
        return prompt_of(adapter, encoded)
    owner = cache.setdefault("_encoded", encoded)
    if owner is not encoded:
        raise ValueError("cache= belongs to another encoding; use one dict per encoding")
    if "prompt" not in cache:
        cache["prompt"] = prompt_of(adapter, encoded)
    return cache["prompt"]


def _layer(prompt, layer) -> int:
    return _int("layer", layer, 1, prompt.n_layers)


def _prefix(prompt, layer: int, cache: dict | None):
    """Layers 0..K-1 on the full prompt with a KV cache and the FastV/DART signals; cached."""
    from transformers import DynamicCache

    from ._decoder import run_prefix

    key = ("prefix", layer)
    if cache is not None and key in cache:
        return cache[key]
    prefix = run_prefix(prompt, layer, cache=DynamicCache(config=prompt.lm.config), capture=True)
    if cache is not None:
        cache[key] = prefix
    return prefix


@torch.no_grad()
def select(adapter, encoded: Encoded, method: str, budget, *, cache: dict | None = None, **params) -> Selection:
    """The visual tokens `method` keeps at layer K, as a Selection over the N_V visual tokens.

    budget: int tokens in [1, N_V] or share in (0, 1]. cache: one caller-owned dict per encoding;
    the first K layers run once per (encoding, K) and later calls (another budget, other pivots)
    only re-rank. extras: {"layer": K, ...} (DART: pivots, the parameters, which pivot picked what).
    """
    _check_method(method)
    p = _params(method, params)
    prompt = _get_prompt(adapter, encoded, cache)
    layer = _layer(prompt, p["layer"])
    k = resolve_budget(budget, encoded.n_visual)
    prefix = _prefix(prompt, layer, cache)
    vis = prompt.visual_positions
    if method == "fastv":
        from .fastv import fastv_rank

        sel = fastv_rank(prefix.last_attention[vis], k)
    else:
        from .dart import dart_rank

        hidden = _dart_hidden(prompt, prefix, cache)
        sel = dart_rank(prefix.key_l1[vis], prefix.key_l1[hidden["text_positions"]], hidden["image"],
                        hidden["text"], k, p["image_pivots"], p["text_pivots"])
        sel.extras["pivots_text_positions"] = hidden["text_positions"][sel.extras["pivots_text"].to(vis.device)].cpu()
        sel.extras.update(image_pivots=p["image_pivots"], text_pivots=p["text_pivots"])
    sel.method = method
    sel.extras["layer"] = layer
    return sel


def _dart_hidden(prompt, prefix, cache: dict | None) -> dict:
    """Normed (final norm) hidden states entering layer K: image rows and text-candidate rows."""
    key = ("dart_hidden", prefix.layer)
    if cache is not None and key in cache:
        return cache[key]
    vis = prompt.visual_positions
    after = torch.arange(int(vis.max()) + 1, prompt.length, device=vis.device)  # tokens after the last image token
    normed = prompt.lm.norm(prefix.hidden)[0]  # (L, d)
    out = {"image": normed[vis].float(), "text": normed[after].float(), "text_positions": after}
    if cache is not None:
        cache[key] = out
    return out


def _keep(encoded: Encoded, keep):
    if isinstance(keep, Selection) and keep.tokens is not None:
        raise ValueError("keep carries merged tokens (Selection.tokens, e.g. VisionZip); in-LLM pruning keeps "
                         "visual tokens by index only: pass keep=selection.keep to drop the merge")
    idx = keep_indices(keep, encoded.n_visual)
    return None if idx is None or idx.numel() == encoded.n_visual else idx


@torch.no_grad()
def prefill_logits(adapter, encoded: Encoded, keep, *, layer: int) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward over the prompt pruned at layer K.

    Rows: the prompt positions that remain after layer K, in prompt order: every non-visual
    token and the kept visual tokens (L' = L - (N_V - K)), i.e. the same rows as
    `adapter.prefill_logits(encoded, keep)`. keep=None (or every index) gives exactly
    `adapter.prefill_logits(encoded)`.
    """
    from ._decoder import continue_prefix, logits_of, run_prefix

    prompt = _get_prompt(adapter, encoded, None)
    layer = _layer(prompt, layer)
    idx = _keep(encoded, keep)
    prefix = run_prefix(prompt, layer)  # no KV cache, like the adapters' prefill
    rows = prompt.kept_sequence(idx)
    h = continue_prefix(prompt, prefix, rows, idx)
    return logits_of(prompt, h)[0].float().cpu()


@torch.no_grad()
def generate(adapter, encoded: Encoded, keep, *, layer: int, max_new_tokens: int = 64,
             cache: dict | None = None, min_new_tokens: int = 0) -> Answer:
    """Greedy answer with the visual tokens pruned at layer K (KV cache: full below K, kept above).

    input_tokens = L' (the prompt length after layer K), visual_tokens = kept count. prefill_s:
    from the call to the first token (the first K layers included unless `cache` already holds
    them from `select`); decode_s: the rest. cache: the dict given to `select` for this encoding
    (optional): its layers 0..K-1 are reused, as FastV computes them once. min_new_tokens: EOS is
    masked before that many tokens (fixed-length benchmarks). keep=None (or every index) gives
    the same tokens as `adapter.generate(encoded)`.
    """
    from transformers import DynamicCache

    from ._decoder import greedy, prefill_cache, run_prefix

    max_new_tokens = _int("max_new_tokens", max_new_tokens, 1)
    min_new_tokens = _int("min_new_tokens", min_new_tokens, 0, max_new_tokens)
    sync = _sync_fn(adapter)
    sync()
    t0 = time.perf_counter()
    prompt = _get_prompt(adapter, encoded, cache)
    layer = _layer(prompt, layer)
    if prompt.max_positions and prompt.next_position + max_new_tokens > prompt.max_positions:
        raise ValueError(f"prompt ({prompt.next_position} positions) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's context {prompt.max_positions}")
    idx = _keep(encoded, keep)
    if cache is not None:
        prefix = _prefix(prompt, layer, cache)
        kv = prefill_cache(prompt, prefix)
    else:
        kv = DynamicCache(config=prompt.lm.config)
        prefix = run_prefix(prompt, layer, cache=kv)
    rows = prompt.kept_sequence(idx)
    first: list[float] = []

    def on_first():
        sync()
        first.append(time.perf_counter())

    ids = greedy(prompt, prefix, kv, rows, idx, max_new_tokens, min_new_tokens, on_first)
    sync()
    t2 = time.perf_counter()
    n_vis = encoded.n_visual if idx is None else int(idx.numel())
    return Answer(text=adapter.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                  input_tokens=int(rows.numel()), visual_tokens=n_vis, prefill_s=first[0] - t0,
                  decode_s=t2 - first[0])


def _sync_fn(adapter):
    model = getattr(adapter, "model", None)
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


__all__ = ["METHODS", "defaults", "generate", "is_in_llm", "prefill_logits", "select"]
