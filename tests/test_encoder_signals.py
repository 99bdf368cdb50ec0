"""A plug-in that asks for more of the vision encoder (another block, per-head attention) runs through every
front door: `mipruner.select`, the checker, `python -m mipruner.eval`, and the engine, which re-encodes a
cached encoding that lacks what a newly chosen method asks for. The per-family signals themselves are
checked in tests/models/test_family_contract.py (`test_encoder_signals`)."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner import Signals
from mipruner import plugins as P
from mipruner.testing import check_pruner, embedded_encoding

from .plugin_registry import registry_restored

PLUGIN = '''
import torch
from mipruner import Selection, register_pruner

@register_pruner("{name}", stage="vision", needs=("attention_heads",), encoder_layer={layer},
                 label="Busiest head of the last block", score_label="[CLS] attention (max over heads)")
def {name}(visual, text, budget, *, attention_heads=None):
    """Tokens the busiest head of block {layer} attends to most from its [CLS] (column sums without one)."""
    n = visual.shape[0]
    row = attention_heads[:, 0, 1:] if attention_heads.shape[-1] == n + 1 else attention_heads.sum(1)  # (H, N)
    scores = row.float().max(0).values  # (N,)
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    return Selection.from_order(order, scores)
'''


def expected(heads: torch.Tensor, n: int, budget: int) -> list[int]:
    row = heads[:, 0, 1:] if heads.shape[-1] == n + 1 else heads.sum(1)
    return sorted(torch.sort(row.max(0).values, descending=True, stable=True).indices[:budget].tolist())


@pytest.fixture(autouse=True)
def registry(tmp_path):
    """Each test loads into the process's registry; it is restored afterwards, and the plug-in files' modules
    forgotten (only those: the model code a test imports stays, as the rest of the process expects)."""
    with registry_restored(tmp_path):
        yield


def plugin(tmp_path, name: str = "last_heads", layer: int = -1) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(PLUGIN.format(name=name, layer=layer)))
    P.load_plugins(str(path))
    assert name in mipruner.list_pruners(), P.problems()
    return str(path)


@pytest.fixture(scope="module")
def embedded():
    return embedded_encoding(signals=Signals(heads=frozenset({-1, 0}), features=True))


def test_a_method_asks_for_its_block_and_heads(tmp_path):
    plugin(tmp_path)
    assert mipruner.signals_for(["last_heads"]) == Signals(layers=frozenset({-1}), heads=frozenset({-1}))
    assert mipruner.signals_for(["vispruner"]) == Signals(layers=frozenset({None}), features=True)  # as its original
    assert mipruner.signals_for(["mi", "random"]) == Signals()
    both = mipruner.signals_for(["last_heads", "attention"])
    assert both.layers == {None, -1} and both.heads == {-1} and not both.features
    assert not mipruner.needs_attention(["mi"]) and mipruner.needs_attention(["last_heads"])


def test_select_reads_the_declared_block(tmp_path, embedded):
    plugin(tmp_path)
    plugin(tmp_path, "first_heads", layer=0)
    ad, enc = embedded
    assert enc.encoder_depth - 1 == enc.encoder_block  # the embedded model's projector reads the last block
    heads = enc.signal("attention_heads", -1)
    assert heads is enc.signal("attention_heads", None)
    assert heads.shape[0] == ad.config.vision_config.num_attention_heads and heads.shape[-1] == enc.n_visual + 1
    assert mipruner.select(ad, enc, "last_heads", 7).keep.tolist() == expected(heads, enc.n_visual, 7)
    first = enc.signal("attention_heads", 0)
    assert first.shape == heads.shape and not torch.equal(first, heads)
    picked = mipruner.select(ad, enc, "first_heads", 7).keep.tolist()
    assert picked == expected(first, enc.n_visual, 7) != expected(heads, enc.n_visual, 7)
    plain = ad.encode(enc.frames[0], enc.prompt, need_attention=True)
    with pytest.raises(ValueError, match="attention_heads of block -1, which this encoding lacks"):
        mipruner.select(ad, plain, "last_heads", 7)
    # VisPruner takes the pre-projector features where the encoding has them
    assert enc.features is not None and enc.features.shape == (enc.n_visual, ad.config.vision_config.hidden_size)


def test_the_checker_passes_it_and_names_a_block_that_does_not_exist(tmp_path):
    plugin(tmp_path)
    assert check_pruner("last_heads") == []
    plugin(tmp_path, "far_heads", layer=40)
    failures = check_pruner("far_heads")
    assert len(failures) == 1 and "encoder block 40 does not exist" in failures[0], failures


def test_registration_checks_the_block():
    with pytest.raises(ValueError, match="encoder_layer must be an int"):
        mipruner.register_pruner("bad_layer", stage="vision", needs=("attention",), encoder_layer=True)(
            lambda visual, text, budget, *, attention=None: None)
    with pytest.raises(ValueError, match="reads neither"):
        mipruner.register_pruner("no_attention", encoder_layer=-1)(lambda visual, text, budget: None)


def test_eval_runs_it_next_to_mi(tmp_path, capsys):
    from mipruner.eval.__main__ import main

    path = plugin(tmp_path)
    rc = main(["--plugins", path, "--methods", "last_heads,mi", "--budgets", "8", "--n", "2", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "last_heads" in out.out and "failed" not in out.err


def picture() -> Image.Image:
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 255, size=(96, 96, 3), dtype=np.uint8)
    arr[20:60, 30:70] = (255, 0, 0)
    return Image.fromarray(arr)


def test_the_engine_extends_a_cached_encoding_for_a_method_chosen_later(tmp_path, embedded):
    from mipruner.serve.service import ModelService

    plugin(tmp_path)
    plugin(tmp_path, "far_heads", layer=40)
    engine = ModelService(embedded[0])
    s = engine.new_session()
    key = engine.encode(s, picture(), "What colour is the square?", need_attention=True)  # as the app encodes
    before = engine.encoded(s, key)
    assert before.signal("attention_heads", -1) is None
    views = engine.view(s, key, ["mi", "last_heads", "far_heads"], 6)
    assert views[0].error is None and views[1].error is None, (views[0].error, views[1].error)
    assert "encoder block 40 does not exist" in views[2].error  # costs only its own panel
    after = engine.encoded(s, key)
    assert after is not before and after.signals.heads == {-1}
    assert torch.equal(after.visual, before.visual) and torch.equal(after.attention, before.attention)
    assert views[1].selection.keep.tolist() == expected(after.signal("attention_heads", -1), after.n_visual, 6)
    assert engine.encode(s, picture(), "What colour is the square?", methods=["last_heads"]) == key
    assert engine.encoded(s, key) is after  # covered: no second re-encoding


def test_signals_requests():
    s = Signals(heads=frozenset({-1}))
    assert s.layers == {-1} and s.attention and s.extra  # a block per head is a block
    assert Signals.of(True) == Signals(layers=frozenset({None})) and not Signals.of(True).extra
    assert Signals.of(False, None) == Signals() and not Signals().attention
    both = Signals.of(True, Signals(features=True))
    assert both.covers(Signals(features=True)) and both.covers(Signals.of(True)) and not both.covers(s)
    assert (both | s).covers(s) and (both | s).covers(both)
    for bad in (True, 1.5, "1"):
        with pytest.raises(ValueError, match="encoder_layer must be an int"):
            Signals(layers=frozenset({bad}))


def test_encode_for_records_what_the_methods_ask(embedded):
    ad, enc = embedded
    e = mipruner.encode_for(ad, enc.frames[0], enc.prompt, ["vispruner", "mi"])
    assert e.signals == Signals(layers=frozenset({None}), features=True) and e.features is not None
    assert torch.equal(e.features, enc.features) and torch.equal(e.attention, enc.attention)
    assert mipruner.encode_for(ad, enc.frames[0], enc.prompt, ["mi"]).attention is None


def test_a_re_encoding_is_charged_to_the_byte_cap(tmp_path, embedded):
    """More signals are more bytes: the cap over every session's encodings hears of the re-encoding at
    once (here a second `encode` naming a method that asks for more), so memory stays bounded."""
    from mipruner.serve.service import ModelService

    plugin(tmp_path)
    engine = ModelService(embedded[0])
    s = engine.new_session()
    key = engine.encode(s, picture(), "What colour is the square?", need_attention=True)
    small = engine.cache.total_bytes
    assert engine.encode(s, picture(), "What colour is the square?", methods=["last_heads"]) == key
    heads = engine.encoded(s, key).signal("attention_heads", -1)
    assert heads is not None and engine.cache.total_bytes >= small + heads.numel() * heads.element_size()
