"""The decoding engine's declarations: one generation config checked at the edge and passed down as an
object, abilities declared (never probed), a read-only decoding path, the declared bucket set, and a
typed per-request state that nothing outside `mipruner/models/` reads."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import pytest
import mipruner
from mipruner.models.base import Abilities, Adapter
from mipruner.models.common.dummy import DummyAdapter
from mipruner.models.common.generation import GenerationConfig
from mipruner.models.common.path import DecodePath
from mipruner.models.common.request import ProcessorState, RequestState
from mipruner.models.common.state import Buckets, DecodeState, static_slots
from mipruner.testing import embedded_encoding

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("bad", [0, -3, 1.5, float("nan"), float("inf"), True, "many", None])
def test_max_new_tokens_is_checked_where_the_config_is_made(bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=bad)


def test_the_config_is_frozen_normalised_and_refuses_sampling():
    cfg = GenerationConfig.of(7.0, min_new_tokens=7, eos_token_id=5, top_k=3)
    assert (cfg.max_new_tokens, cfg.min_new_tokens, cfg.eos_token_id) == (7, 7, (5,))
    assert dict(cfg.extra) == {"top_k": 3} and not hasattr(cfg, "logits_processor")
    with pytest.raises(AttributeError):
        cfg.max_new_tokens = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.extra["top_k"] = 4  # type: ignore[index]
    with pytest.raises(ValueError, match="greedy"):
        GenerationConfig.of(4, do_sample=True)
    with pytest.raises(ValueError, match="min_new_tokens"):
        GenerationConfig(max_new_tokens=2, min_new_tokens=3)
    assert GenerationConfig.of(None, cfg) is cfg and GenerationConfig.of(7, cfg) is cfg
    with pytest.raises(ValueError, match="either"):
        GenerationConfig.of(8, cfg)
    with pytest.raises(ValueError, match="either"):
        GenerationConfig.of(None, cfg, eos_token_id=1)


def test_equal_configs_hash_equal_and_a_config_round_trips_through_a_dict():
    a = GenerationConfig.of(9, min_new_tokens=2, eos_token_id=[5, 6], pad_token_id=0, top_k=3,
                            bad_words_ids=((1, 2),), sequence_bias={(4,): -1.5})
    b = GenerationConfig(max_new_tokens=9.0, min_new_tokens=2, eos_token_id=(5, 6), pad_token_id=0,
                         extra={"sequence_bias": {(4,): -1.5}, "bad_words_ids": [[1, 2]], "top_k": 3})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != dataclasses.replace(a, pad_token_id=1) and hash(GenerationConfig()) == hash(GenerationConfig())
    assert {GenerationConfig(max_new_tokens=3): "x"}[GenerationConfig.of(3)] == "x"  # a dict key
    d = a.to_dict()
    assert d == {"max_new_tokens": 9, "min_new_tokens": 2, "eos_token_id": [5, 6], "pad_token_id": 0,
                 "extra": {"top_k": 3, "bad_words_ids": [[1, 2]], "sequence_bias": {(4,): -1.5}}}
    assert GenerationConfig.from_dict(d) == a and hash(GenerationConfig.from_dict(d)) == hash(a)
    plain = GenerationConfig.of(4, eos_token_id=(), num_beams=1, bad_words_ids=[[3]])
    back = GenerationConfig.from_dict(json.loads(json.dumps(plain.to_dict())))  # through JSON
    assert back == plain and back.eos_token_id == () and back.generate_kwargs() == plain.generate_kwargs()
    with pytest.raises(TypeError, match="unknown field"):
        GenerationConfig.from_dict({**d, "temperature": 0.5})


@pytest.mark.parametrize("where", ["field", "of", "extra", "nested", "object"])
def test_a_callable_inside_the_config_is_a_sentence(where):
    make = {"field": lambda: GenerationConfig(max_new_tokens=3, logits_processor=[abs]),
            "of": lambda: GenerationConfig.of(3, logits_processor=[abs]),
            "extra": lambda: GenerationConfig(extra={"stopping_criteria": abs}),
            "nested": lambda: GenerationConfig.of(3, sequence_bias={(1,): abs}),
            "object": lambda: GenerationConfig.of(3, streamer=object())}[where]
    with pytest.raises(TypeError, match=r"GenerationConfig holds values only .* callables travel beside a config.*"
                                        r"logits_processor=\[\.\.\.\]"):
        make()
    with pytest.raises(ValueError, match="logits_processor must hold callables"):
        mipruner.answer(*embedded_encoding(), None, max_new_tokens=2, logits_processor=[3])


def test_an_in_llm_answer_refuses_a_logits_processor_beside_its_config():
    a, enc = embedded_encoding()
    sel = mipruner.select(a, enc, "fastv", 8, cache={})
    with pytest.raises(ValueError, match="max_new_tokens and min_new_tokens only"):
        mipruner.answer(a, enc, sel, max_new_tokens=2, logits_processor=[lambda ids, s: s])


def test_resolve_fills_eos_and_pad_from_the_model():
    a, _ = embedded_encoding()
    cfg = GenerationConfig(max_new_tokens=3).resolve(a.model, None)
    eos = a.model.generation_config.eos_token_id
    want = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    assert cfg.eos_token_id == want and cfg.pad_token_id == (want[0] if want else 0)
    assert GenerationConfig(max_new_tokens=3, eos_token_id=()).resolve(a.model, 9).pad_token_id == 9
    assert cfg.resolve(a.model, 9) == cfg  # resolving twice changes nothing


def test_a_bad_length_fails_once_at_the_edge_and_a_config_passes_down_unchanged(monkeypatch):
    """`mipruner.answer` builds the config; `adapter.generate` gets that very object (nothing re-checks it)."""
    a, enc = embedded_encoding()
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        mipruner.answer(a, enc, None, max_new_tokens=0)
    seen = []
    real = type(a).generate

    def spy(self, encoded, keep=None, max_new_tokens=None, positions=None, *, config=None, **gen):
        seen.append(config)
        return real(self, encoded, keep, max_new_tokens, positions, config=config, **gen)

    monkeypatch.setattr(type(a), "generate", spy)
    cfg = GenerationConfig(max_new_tokens=2)
    ans = mipruner.answer(a, enc, None, config=cfg)
    assert seen == [cfg] and seen[0] is cfg and 1 <= len(ans.token_ids) <= 2


def test_abilities_are_declared_not_probed():
    assert DummyAdapter.abilities == Abilities() and not DummyAdapter().batch_decoding
    a, _ = embedded_encoding()
    assert a.abilities.batch_decoding and a.batch_decoding and a.batch_encoding
    with pytest.raises(TypeError, match="abilities = Abilities"):
        class Probed(DummyAdapter):  # noqa: F841 - the old way: an attribute a caller would probe
            batch_decoding = True
    with pytest.raises(TypeError, match="Abilities"):
        class Wrong(DummyAdapter):  # noqa: F841
            abilities = {"batch_decoding": True}
    with pytest.raises(AttributeError):
        a.batch_decoding = False  # read from `abilities` only
    src = (ROOT / "mipruner" / "serve" / "batch.py").read_text()
    assert 'getattr(adapter, "batch_' not in src


def test_the_decode_path_is_read_only():
    state = DecodeState()
    with pytest.raises(AttributeError):
        state.path = DecodePath(bucket=64)  # type: ignore[misc]
    assert state.choose(bucket=64, static_cache=True) == DecodePath(bucket=64, static_cache=True) == state.path
    a, _ = embedded_encoding()
    with pytest.raises(AttributeError):
        a.decode_path = DecodePath(bucket=64)  # type: ignore[misc]
    with pytest.raises(ValueError, match="plain path"):
        DummyAdapter().use_decode_path(bucket=64)


def test_buckets_hold_only_the_declared_shapes():
    b = Buckets.grid([1, 2, 4], [64, 128], [3], 64)
    assert b.holds("prefill", (4, 128)) and not b.holds("prefill", (8, 128)) and not b.holds("prefill", (4, 192))
    assert b.holds("step", (2, static_slots(128, 3, 64))) and not b.holds("step", (2, static_slots(128, 512, 64)))
    assert b.holds("tower", (1,)) and not b.holds("tower", (2,)) and len(b) == 6 + 6 + 1
    narrowed = b.narrowed({"prefill": {(1, 64)}, "step": set()})
    assert narrowed.holds("prefill", (1, 64)) and not narrowed.holds("prefill", (2, 64)) and len(narrowed) == 1
    state = DecodeState()
    assert state.allows("prefill", (32, 4096))  # nothing declared: each shape on its first use
    state.declare(narrowed)
    assert state.allows("prefill", (1, 64)) and not state.allows("prefill", (2, 64))


def test_the_request_state_is_typed_and_read_only_under_models():
    _, enc = embedded_encoding()
    assert isinstance(enc.state, ProcessorState) and isinstance(enc.state, RequestState)
    assert enc.prompt_tokens == int(enc.state.input_ids.numel()) > enc.n_visual
    assert enc.state.ref and enc.state.visual_positions.numel() == enc.n_visual  # fields only (test_request_state.py)
    readers = []
    for path in (ROOT / "mipruner").rglob("*.py"):
        if "models" in path.relative_to(ROOT / "mipruner").parts[:1]:
            continue
        if re.search(r"\.state(\[|\.get\(|\.[a-z_]+\b(?!\())", path.read_text().replace("decode_state", "")):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == [], readers


def test_every_shipped_adapter_declares_its_abilities():
    for fam in mipruner.models.FAMILIES.values():
        cls = fam.adapter_class()
        assert issubclass(cls, Adapter) and cls.abilities.batch_decoding, fam.name
