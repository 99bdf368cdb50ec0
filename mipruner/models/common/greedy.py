"""The decoding engine's one greedy loop.

`greedy` decodes what `generate(do_sample=False)` would for the configs `greedy_supported` accepts,
after any prefill (the rows' first logits) and over any step function: the LLaVA family and Qwen
(`common/decode.DecodeEngine`) alike, one row or a batch.
"""
from __future__ import annotations

import torch

__all__ = ["greedy", "greedy_supported"]


# ----------------------------------------------------------------------------------------------
# greedy decoding after a prefill (every family)

# generation-config fields that add logits processors in `generate`; a model whose config sets one
# answers through `generate` itself (`greedy_supported`)
_PROCESSOR_FIELDS = ("repetition_penalty", "encoder_repetition_penalty", "sequence_bias", "no_repeat_ngram_size",
                     "encoder_no_repeat_ngram_size", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
                     "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
                     "remove_invalid_values", "renormalize_logits", "min_length")


def greedy_supported(model, config) -> bool:
    """Whether `greedy` decodes exactly what `model.generate(**config.generate_kwargs())` would: no
    `extra` generate argument, and no processor from the model's generation config."""
    if config.extra:
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
