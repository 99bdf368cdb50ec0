"""The small word-level tokenizer the random-weight models share: no download, offsets included.

Its vocabulary is `specials` then the sorted `words`; `split` names the specials that are cut out of
running text before the whitespace and punctuation split (placeholders such as <image> written
against a word). Answers of a random model mean nothing; the tokenizer only has to read prompts and
chat templates the way the families' processors expect.
"""
from __future__ import annotations


def word_tokenizer(specials: list[str], words, *, split=(), chat_template: str, additional=(),
                   lowercase: bool = False, digits: bool = False, **tokens):
    """A `PreTrainedTokenizerFast` over `specials` + sorted(set(words)); `tokens` are its named
    tokens (unk_token=, eos_token=, extra_special_tokens=...), `additional` its additional special
    tokens; lowercase / digits: lower-case the text, read digits one by one."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(list(specials) + sorted(set(words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tokens.get("unk_token", "<unk>")))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    steps = [pre_tokenizers.Split(s, "isolated") for s in split]
    steps += [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **tokens)
    if additional:
        fast.add_special_tokens({"additional_special_tokens": list(additional)})
    fast.chat_template = chat_template
    return fast
