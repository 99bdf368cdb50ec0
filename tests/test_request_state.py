"""The typed per-request state (`mipruner.models.common.request`) is read by its fields only: no string-keyed
`state["name"]` / `state.get("name")` / `"name" in state` beside them, and a plug-in written against the
fields (an in-LLM method, the one kind that is handed the encoding) selects and answers through every door."""
from __future__ import annotations

import textwrap

import pytest
import torch

import mipruner
from mipruner import plugins as P
from mipruner.models.common.request import ProcessorState, QwenState, RequestState
from mipruner.pruners import _registry
from mipruner.testing import embedded_encoding

# An in-LLM plug-in reading the state's typed fields: it keeps the `budget` visual tokens that sit latest in
# the unpruned prompt (nearest the question), scored by their position in it.
PLUGIN = '''
import torch
from mipruner import Selection, register_pruner
from mipruner.models.common.generation import GenerationConfig


def answer_latest(adapter, encoded, selection, *, max_new_tokens, cache=None, min_new_tokens=0):
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)
    return adapter.generate(encoded, keep=selection, config=cfg)


@register_pruner("latest_fields", stage="llm", answer=answer_latest, label="latest (fields)")
def latest_fields(adapter, encoded, budget, *, cache=None):
    """The visual tokens latest in the prompt."""
    st = encoded.state
    pos = st.visual_positions.to(encoded.visual.device)  # (N_V,) their indices in st.input_ids
    assert pos.numel() == encoded.n_visual and int(pos.max()) < st.input_ids.numel() and st.templated
    scores = pos.to(torch.float32) / st.input_ids.numel()
    order = torch.argsort(scores, descending=True, stable=True)[:budget]
    return Selection.from_order(order, scores)
'''


@pytest.fixture
def registry():
    mipruner.list_pruners()
    saved = (_registry.METHODS.snapshot(), dict(P._LOADED))
    yield
    _registry.METHODS.restore(saved[0])
    P._LOADED.clear()
    P._LOADED.update(saved[1])


@pytest.mark.parametrize("cls", [RequestState, ProcessorState, QwenState])
def test_the_state_has_no_string_keyed_lookup(cls):
    for name in ("__getitem__", "get", "__contains__"):
        assert not hasattr(cls, name), f"{cls.__name__}.{name}"
    st = ProcessorState(input_ids=torch.arange(5), visual_positions=torch.tensor([1, 2]), extra={"raw": 1})
    with pytest.raises(TypeError):
        st["input_ids"]  # noqa: B018
    assert st.extra["raw"] == 1 and st.prompt_tokens == 5


def test_a_plugin_written_against_the_fields_selects_and_answers(tmp_path, registry):
    path = tmp_path / "latest_fields.py"
    path.write_text(textwrap.dedent(PLUGIN))
    assert P.load_plugins(str(path)) == []
    ad, enc = embedded_encoding()
    k = 5
    sel = mipruner.select(ad, enc, "latest_fields", k)
    pos = enc.state.visual_positions
    want = torch.argsort(pos, descending=True, stable=True)[:k].sort().values
    assert sel.method == "latest_fields" and sel.keep.tolist() == want.tolist()
    assert sel.keep.tolist() == list(range(enc.n_visual - k, enc.n_visual))  # visual rows in prompt order
    got = mipruner.answer(ad, enc, sel, max_new_tokens=3)
    plain = ad.generate(enc, keep=sel, max_new_tokens=3)
    assert got.token_ids == plain.token_ids and got.visual_tokens == k
