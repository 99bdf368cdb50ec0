"""A logits processor travels beside the `GenerationConfig` (which holds values only) and changes the decoded
tokens exactly as transformers' own greedy `generate` does with the same processor, on tiny random checkpoints
built from configs: LLaVA-1.5 (its plain path, the model's `generate`; and the decoding engine, a batch of one)
and Qwen2-VL (the decoding engine). The processor bans the unprocessed answer's first token at every step,
so the tokens really change; `min_new_tokens` = the length on both sides, so no EOS ends either early."""
from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

import mipruner
from mipruner.serve.batch import answer_batch
from mipruner.models.common.generation import GenerationConfig

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from . import tiny_qwen
from .anchor import reference_inputs
from .test_qwen_family import scene as qwen_scene
from .tiny_llava import save_tiny, scene

PROMPT = "What colour is the square?"
NEW = 5


class Ban:
    """A logits processor: token `token` never picked (its score -inf), at every step."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        return scores.index_fill(-1, torch.tensor([self.token], device=scores.device), float("-inf"))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("beside")
    llava = mipruner.load(save_tiny("llava", str(root / "llava")), device="cpu")
    qwen = mipruner.load(tiny_qwen.build("qwen2_vl", str(root)))
    return {"llava": (llava, llava.encode(scene(112, 56, square=(70, 14, 84, 28)), PROMPT)),
            "qwen2_vl": (qwen, qwen.encode(qwen_scene(), PROMPT))}


def transformers_greedy(a, e, procs=()) -> list[int]:
    """transformers' own greedy `generate` on the model's own inputs, the new tokens."""
    inputs = reference_inputs(e)
    out = a.model.generate(**inputs, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                           logits_processor=LogitsProcessorList(list(procs)))
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("name", ["llava", "qwen2_vl"])
def test_a_processor_beside_the_config_decodes_as_transformers(cases, name):
    a, e = cases[name]
    plain = transformers_greedy(a, e)
    ban = Ban(plain[0])
    want = transformers_greedy(a, e, [ban])
    assert want != plain and plain[0] not in want  # the processor really changes the answer
    cfg = GenerationConfig(max_new_tokens=NEW, min_new_tokens=NEW)
    assert mipruner.answer(a, e, None, config=cfg).token_ids == plain
    assert mipruner.answer(a, e, None, config=cfg, logits_processor=[ban]).token_ids == want
    assert a.generate(e, config=cfg, logits_processor=[ban]).token_ids == want
    (row,) = answer_batch(a, e, [None], config=cfg, logits_processor=[ban])  # the decoding engine
    assert row.token_ids == want
    assert hash(cfg) == hash(GenerationConfig.from_dict(cfg.to_dict()))  # nothing of the processor in it
