"""Which prompt tokens count as "text" when a pruner scores visual tokens.

The published methods differ here: the question only, the question without stopwords (MMTok),
or every non-image token of the chat template. We make it a visible choice:

  "question"   the user's prompt only; template and system text excluded (default)
  "nostop"     the user's prompt without stopwords and punctuation-only tokens
  "prompt"     every non-visual token of the templated prompt

Tokens are matched to the user's prompt through the tokenizer's character offsets into the
templated string, so no token id or template layout is hard-coded.
"""
from __future__ import annotations

import torch

TEXT_MODES = ("question", "nostop", "prompt")

# A small English stopword list (function words that carry no visual content).
STOPWORDS = frozenset("""
a an the this that these those is are was were be been being am do does did have has had of in on
at to for from by with about as into onto over under than then there here it its it's i me my we
our you your he she his her they them their what which who whom whose where when why how can could
would should will shall may might must not no yes or and but if so any some each all both either
neither please answer question using single word phrase image picture photo shown show describe
tell give see look one
""".split())


def span_mask(offsets: list[tuple[int, int]], start: int, end: int) -> torch.Tensor:
    """(N,) bool: tokens whose character span overlaps [start, end)."""
    return torch.tensor([(e > start and s < end and e > s) for s, e in offsets], dtype=torch.bool)


def is_content_token(token: str) -> bool:
    """A token carrying a word of its own, not a stopword or punctuation: what `text_mode="nostop"` scores."""
    word = token.replace("\u2581", " ").replace("\u0120", " ").strip().strip(".,;:!?\"'()[]{}").lower()
    return bool(word) and word not in STOPWORDS and any(ch.isalnum() for ch in word)


def text_mask(tokens: list[str], offsets: list[tuple[int, int]], templated: str, prompt: str,
              mode: str = "question") -> torch.Tensor:
    """Which of the templated prompt's non-visual tokens count as text (see module docstring).

    tokens/offsets: the non-visual tokens of `templated` and their character spans in it.
    The user's prompt is located as the last occurrence of `prompt` in `templated`.
    Falls back to the whole prompt if the question cannot be located or is left empty.
    """
    if mode not in TEXT_MODES:
        raise ValueError(f"text_mode must be one of {TEXT_MODES}, got {mode!r}")
    everything = torch.ones(len(tokens), dtype=torch.bool)
    if mode == "prompt" or not prompt.strip():
        return everything
    start = templated.rfind(prompt.strip())
    if start < 0:
        return everything
    mask = span_mask(offsets, start, start + len(prompt.strip()))
    if mode == "nostop":
        content = torch.tensor([is_content_token(t) for t in tokens], dtype=torch.bool)
        if bool((mask & content).any()):
            mask = mask & content
    return mask if bool(mask.any()) else everything
