"""In-LLM methods: FastV and DART drop visual tokens INSIDE the language model.

Unlike the pre-LLM methods (which select from the encoding alone), these read signals from the
first K decoder layers run on the full prompt, then continue from layer K with the kept tokens only
(`_decoder.py` explains how, without touching transformers classes). They are registered in the
one method registry (stage "llm"), so they are used like every other method:

    sel = mipruner.select(adapter, enc, "fastv", 64, cache=c)    # runs layers 0..K-1 once per (enc, K)
    sel = mipruner.select(adapter, enc, "fastv", 0.25, cache=c)  # another budget: re-rank only
    ans = mipruner.answer(adapter, enc, sel, cache=c)            # pruned at sel.extras["layer"]
    logits = inllm.prefill_logits(adapter, enc, sel, layer=2)

`sel.keep` indexes the N_V visual tokens of `enc` like every Selection, so masks can be drawn.
`layer` must lie in [1, number of decoder layers]; at K = number of layers no layer ever sees the
pruned sequence, so the answer is the unpruned one (only fewer prompt rows get logits).

Writing one: `register_inllm` with a function of a `DecoderRun` (`mipruner.inllm.api`, the public
API: `run.at(layer)` -> `StageView` (attention of chosen query rows, hidden states, key norms),
`run.keep(view, visual, merge=Merge(...))`); FastV, DART and SparseVLM are written on it.


Supported families: every row of the family table (`mipruner.models.FAMILIES`: LLaVA-1.5, LLaVA-NeXT,
Video-LLaVA, LLaVA-OneVision, InternVL, Qwen2-VL, Qwen2.5-VL, Qwen3-VL; the family contract,
tests/models/test_family_contract.py, runs every in-LLM method on each); an adapter without
`llm_inputs` raises NotImplementedError.
"""
from ._run import answer, generate, prefill_logits, prepare
from .api import POSITIONS, QUERIES, DecoderRun, Merge, StageView, register_inllm
from .api import prefill_logits as staged_prefill_logits

# Importing a method module registers it (one line per method module).
from . import fastv  # noqa: E402,F401
from . import dart  # noqa: E402,F401
from . import sparsevlm  # noqa: E402,F401
from . import pyramiddrop  # noqa: E402,F401
from . import dycoke  # noqa: E402,F401

__all__ = ["DecoderRun", "Merge", "POSITIONS", "QUERIES", "StageView", "answer", "generate", "prefill_logits",
           "prepare", "register_inllm", "staged_prefill_logits"]
