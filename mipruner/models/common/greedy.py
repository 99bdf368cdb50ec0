"""The decoding engine's one greedy loop.

`greedy` decodes what `generate(do_sample=False)` would for the configs `greedy_supported` accepts,
after any prefill (the rows' first logits) and over any step function: the LLaVA family and Qwen
(`common/decode.DecodeEngine`) alike, one row or a batch.
"""
from __future__ import annotations

import torch

__all__ = ["active_processors", "greedy", "greedy_supported"]


# ----------------------------------------------------------------------------------------------
# greedy decoding after a prefill (every family)

# generation-config fields that add logits processors in `generate` (do_sample=False), each with the test
# transformers' `GenerationMixin._get_logits_processor` applies to it: a model whose config makes one active
# answers through `generate` itself (`greedy_supported`). Per field, never by truthiness: 0 and 1 are real
# token ids (forced_bos_token_id=0), 1 a real n-gram size.
_set = lambda v: v is not None  # noqa: E731
_PROCESSOR_FIELDS = {
    "guidance_scale": lambda v: v is not None and v != 1,
    "sequence_bias": _set,
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "repetition_penalty": lambda v: v is not None and v != 1.0,
    "no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "encoder_no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "bad_words_ids": _set,
    "min_length": lambda v: v is not None and v > 0,
    "forced_bos_token_id": _set,
    "forced_eos_token_id": _set,
    "remove_invalid_values": lambda v: v is True,
    "exponential_decay_length_penalty": _set,
    "suppress_tokens": _set,
    "begin_suppress_tokens": _set,
    "watermarking_config": _set,
    "renormalize_logits": lambda v: v is True,
}


def active_processors(generation_config) -> list[str]:
    """The fields of `generation_config` that make `generate` add a logits processor, in transformers' order."""
    return [name for name, active in _PROCESSOR_FIELDS.items() if active(getattr(generation_config, name, None))]


def greedy_supported(model, config) -> bool:
    """Whether `greedy` decodes exactly what `model.generate(**config.generate_kwargs())` would: no
    `extra` generate argument, and no processor from the model's generation config (`active_processors`)."""
    return not config.extra and not active_processors(model.generation_config)


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
