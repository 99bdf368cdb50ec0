"""Which words of a prompt a model's tokenizer cannot read (the app warns about them).

A word-level tokenizer (the embedded model's) maps unknown words to its unknown token, so the
prompt would reach the model as `<unk>` and every PMI with it would be 0; byte-level tokenizers
read everything.
"""
from __future__ import annotations

from dataclasses import dataclass

SMALL_VOCABULARY = 2000  # a model whose tokenizer has at most this many entries has its words listed


@dataclass
class PromptWords:
    """What the model's tokenizer makes of a prompt: the pieces it cannot read (mapped to its
    unknown token `unk_token`), and, for a small word-level vocabulary (the embedded model), the
    words it knows (None for a large vocabulary)."""

    unknown: list[str]
    unk_token: str | None = None
    known: list[str] | None = None


def prompt_words(tokenizer, prompt: str) -> PromptWords:
    """The prompt's pieces that `tokenizer` maps to its unknown token (byte-level tokenizers have
    none), found through the tokenizer's character offsets."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if tokenizer is None or unk is None:
        return PromptWords([])
    try:
        enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        unknown = [prompt[a:b] or tokenizer.unk_token for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
                   if i == unk]
    except NotImplementedError:  # slow tokenizers give no offsets: count the unknown tokens
        unknown = [tokenizer.unk_token] * tokenizer(prompt, add_special_tokens=False)["input_ids"].count(unk)
    known = None
    if len(tokenizer) <= SMALL_VOCABULARY:
        special = set(tokenizer.all_special_tokens)
        known = sorted(w for w in tokenizer.get_vocab() if w not in special and any(c.isalnum() for c in w))
    return PromptWords(unknown, tokenizer.unk_token, known)


__all__ = ["SMALL_VOCABULARY", "PromptWords", "prompt_words"]
