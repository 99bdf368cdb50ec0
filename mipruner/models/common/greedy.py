"""The decoding engine's one greedy loop, its compiled functions and its static caches.

`greedy` decodes what `generate(do_sample=False)` would for the arguments `greedy_supported` accepts,
after any prefill (the rows' first logits) and over any step function: the LLaVA family and Qwen
(`common/decode.py`) alike. `compiled` keeps the compiled prefill and step per model; `static_cache`
the static caches of the last STATIC_CACHES shapes.
"""
from __future__ import annotations

import torch

__all__ = ["COMPILE", "RECOMPILE_LIMIT", "STATIC_CACHES", "compiled", "greedy", "greedy_supported", "static_cache"]


# ----------------------------------------------------------------------------------------------
# greedy decoding after a prefill (every family)

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
           slots: int | None = None, on_first=None) -> tuple[list[list[int]], float]:
    """Greedy tokens (B rows, up to `max_new_tokens`) after a prefill whose last-row logits are
    `first_logits` (B, V); `step(tokens (B,), mask (B, W + t))` runs one decoding step and returns
    its logits (B, V). As `generate` does: EOS masked while fewer than `min_new_tokens` are out, the
    `procs` (callables (generated (B, t), scores (B, V)) -> scores) applied after, finished rows fed
    `pad_id`, one host sync a step (the stop check). `slots`: a static cache of that many slots, the
    mask then has its width from the start (zeros for slots not written yet: one shape every step,
    as `generate` gives its compiled step). `on_first()`: called once the first token is picked.
    Returns (token rows, time of the first token)."""
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
    if on_first is not None:
        on_first()
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

RECOMPILE_LIMIT = 64  # shapes one compiled function may take (the fixed buckets: rows x widths)
COMPILE = {"dynamic": False}  # torch.compile arguments of the compiled prefill and step (tests set a backend)


def compiled(adapter, name: str, fn):
    """`torch.compile(fn, **COMPILE)` kept on the adapter under `name` (one per model): the packed
    prefill and the decoding step. On CUDA with mode "reduce-overhead" (CUDA graphs: no launch
    overhead); each new shape (bucket, batch size) compiles once. Off CUDA `fn` itself, unless COMPILE
    names a backend."""
    if adapter.device.type != "cuda" and "backend" not in COMPILE:
        return fn  # as `generate` does: no compiling off CUDA unless a backend is named (tests)
    state = adapter.decode_state
    held = state.compiled.get(name)
    if held is None or held[0] is not adapter.model:
        kw = dict(COMPILE)
        if adapter.device.type == "cuda" and "backend" not in kw:
            kw.setdefault("mode", "reduce-overhead")
        # one graph per shape of the fixed set (`common/decode.py`): dynamo's default limit (8) would
        # silently send the ninth shape to eager
        torch._dynamo.config.recompile_limit = max(int(torch._dynamo.config.recompile_limit), RECOMPILE_LIMIT)
        held = (adapter.model, torch.compile(fn, **kw))
        state.compiled[name] = held
    return held[1]


STATIC_CACHES = 3  # static caches kept per model: the app's view (B rows), its slider moves (B - 1), one answer


def static_cache(adapter, batch: int, length: int):
    """A StaticCache of `length` slots for `batch` rows, kept on the adapter and reset when its shape
    comes again, so that a compiled step sees the same buffers (a CUDA graph is recorded for buffers:
    new ones would record it again). The last STATIC_CACHES shapes are kept (least recently used
    dropped): the app alternates between a view's rows and a slider move's rows, each reusing its own."""
    from transformers import StaticCache

    held = adapter.decode_state.caches
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
