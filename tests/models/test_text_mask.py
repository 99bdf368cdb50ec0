"""Which prompt tokens count as text: located through character offsets, never token ids."""
import pytest
import torch

from mipruner.models.common.text import TEXT_MODES, is_content_token, text_mask


def tokenize(s):
    # A whitespace tokenizer with character offsets, standing in for a fast tokenizer.
    out, i = [], 0
    for word in s.split(" "):
        j = s.index(word, i)
        out.append((word, (j, j + len(word))))
        i = j + len(word)
    return [w for w, _ in out], [o for _, o in out]


TEMPLATED = "SYSTEM: be helpful. USER: What color is the big circle ? ASSISTANT:"
PROMPT = "What color is the big circle ?"


def test_question_mode_selects_only_the_question():
    tokens, offsets = tokenize(TEMPLATED)
    m = text_mask(tokens, offsets, TEMPLATED, PROMPT, "question")
    assert [t for t, k in zip(tokens, m.tolist()) if k] == PROMPT.split(" ")


def test_nostop_mode_drops_function_words_and_punctuation():
    tokens, offsets = tokenize(TEMPLATED)
    m = text_mask(tokens, offsets, TEMPLATED, PROMPT, "nostop")
    assert [t for t, k in zip(tokens, m.tolist()) if k] == ["color", "big", "circle"]


def test_prompt_mode_and_fallbacks():
    tokens, offsets = tokenize(TEMPLATED)
    assert bool(text_mask(tokens, offsets, TEMPLATED, PROMPT, "prompt").all())
    # A question that cannot be located falls back to the whole prompt rather than nothing.
    assert bool(text_mask(tokens, offsets, TEMPLATED, "not in there", "question").all())
    # A question made only of stopwords keeps the question tokens in "nostop" mode.
    t2 = "USER: is it ? ASSISTANT:"
    tk, of = tokenize(t2)
    m = text_mask(tk, of, t2, "is it ?", "nostop")
    assert [t for t, k in zip(tk, m.tolist()) if k] == ["is", "it", "?"]


def test_bad_mode():
    with pytest.raises(ValueError, match="text_mode"):
        text_mask(["a"], [(0, 1)], "a", "a", "all")
    assert set(TEXT_MODES) == {"question", "nostop", "prompt"}


@pytest.mark.parametrize("tok,content", [("\u2581circle", True), ("\u0120the", False), ("?", False),
                                         ("red,", True), ("", False)])
def test_content_tokens(tok, content):
    assert is_content_token(tok) is content
