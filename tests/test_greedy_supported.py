"""`greedy_supported` decides per generation-config field as transformers does: our greedy loop answers only
when `generate(do_sample=False)` would add no logits processor. The oracle is transformers itself (its
`_get_logits_processor` on a tiny Llama built from a config), so a field read by truthiness (0 == False,
1 == 1.0: `forced_bos_token_id=0`, `no_repeat_ngram_size=1`) fails here."""
from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, WatermarkingConfig

from mipruner.models.common.generation import GenerationConfig as OurConfig
from mipruner.models.common.greedy import _PROCESSOR_FIELDS, active_processors, greedy_supported

# (field, values that add a processor in generate, values that add none); the boundary values first
CASES = [
    ("forced_bos_token_id", [0, 5], [None]),
    ("forced_eos_token_id", [1, [1, 2]], [None]),
    ("no_repeat_ngram_size", [1, 3], [None, 0]),
    ("remove_invalid_values", [True], [None, False]),
    ("repetition_penalty", [0.9, 1.2], [None, 1.0]),
    ("min_length", [1, 3], [None, 0]),
    ("guidance_scale", [0.5, 2.0], [None, 1.0, 1]),
    ("sequence_bias", [{(3,): 1.0}], [None]),
    ("bad_words_ids", [[[3]]], [None]),
    ("exponential_decay_length_penalty", [(1, 1.1)], [None]),
    ("suppress_tokens", [[3], []], [None]),
    ("begin_suppress_tokens", [[3]], [None]),
    ("renormalize_logits", [True], [None, False]),
]
# read conservatively (an active value means: answer through generate): on a decoder-only model transformers
# adds nothing for them (no encoder input), and the watermark's processor needs a vocabulary to build
CONSERVATIVE = {"encoder_repetition_penalty", "encoder_no_repeat_ngram_size", "watermarking_config"}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def transformers_processors(model, cfg: GenerationConfig) -> int:
    cfg._eos_token_tensor = torch.tensor([2])  # what generate sets before building the processors
    return len(model._get_logits_processor(cfg, input_ids_seq_length=4, device="cpu", model_kwargs={}))


def test_every_field_is_cased():
    assert set(_PROCESSOR_FIELDS) == {c[0] for c in CASES} | CONSERVATIVE


@pytest.mark.parametrize("field,on,off", CASES, ids=[c[0] for c in CASES])
def test_each_field_as_transformers_decides(model, field, on, off):
    assert transformers_processors(model, GenerationConfig()) == 0
    for value, active in [(v, True) for v in on] + [(v, False) for v in off]:
        cfg = GenerationConfig()
        setattr(cfg, field, value)
        assert (transformers_processors(model, cfg) > 0) is active, (field, value)
        assert (active_processors(cfg) == [field]) is active, (field, value)
        model.generation_config = cfg
        assert greedy_supported(model, OurConfig()) is (not active), (field, value)
    model.generation_config = GenerationConfig()


def test_conservative_fields_and_extra_arguments(model):
    for field, value in [("encoder_repetition_penalty", 1.3), ("encoder_no_repeat_ngram_size", 1),
                         ("watermarking_config", WatermarkingConfig())]:
        cfg = GenerationConfig()
        setattr(cfg, field, value)
        assert active_processors(cfg) == [field]
    model.generation_config = GenerationConfig()
    assert greedy_supported(model, OurConfig())
    assert not greedy_supported(model, OurConfig(extra={"num_beams": 2}))  # any other generate argument
