"""LLaVA-1.5's encode path: the vision tower runs only up to the block the projector reads
(`mipruner/models/llava/short_tower.py`), and the geometry is built when first read (`base.LazyGeometry`).

The tiny LLaVA's CLIP tower has 3 blocks and reads hidden_states[-2], the output of block 1: the
shortened pass runs blocks 0 and 1 through the tower's own modules. Same modules, same inputs, same
order as transformers' full pass, so its features and hidden states are the full pass's bit for bit
(exact comparisons); the last block runs only when a method records it.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import mipruner
from mipruner.models.common import clip_attention as A
from mipruner.models.llava import short_tower as T
from mipruner.pruners.signals import Signals

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .tiny_llava import save_tiny, scene

PROMPT = "What colour is the square?"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("tiny_llava") / "llava")), device="cpu")


@contextlib.contextmanager
def calls(module):
    """A list that counts `module`'s forward calls within the block (the hook is removed on exit)."""
    seen = []
    handle = module.register_forward_hook(lambda *_: seen.append(1))
    try:
        yield seen
    finally:
        handle.remove()


def _pixels(adapter, n: int = 2) -> torch.Tensor:
    images = [scene(56, 56, square=(4 * i, 8, 4 * i + 14, 22), seed=i) for i in range(n)]
    return adapter.image_processor(images, return_tensors="pt")["pixel_values"].to(adapter.dtype)


def test_blocks_needed():
    assert T.blocks_needed(24, -2) == 23 and T.blocks_needed(24, -1) == 24 and T.blocks_needed(24, 0) == 0
    assert T.blocks_needed(24, -2, upto=24) == 24 and T.blocks_needed(24, 5, upto=3) == 5
    with pytest.raises(ValueError, match="outside"):
        T.blocks_needed(24, -26)


def test_the_short_tower_is_the_full_towers_features_bit_for_bit(adapter):
    model, tower = adapter.model, adapter.model.model.vision_tower
    pixels = _pixels(adapter)
    layers = A.encoder_layers(tower)
    assert T.applies(model, tower) and model.config.vision_feature_layer == -2 and len(layers) == 3
    full = model.get_image_features(pixel_values=pixels, return_dict=True)
    with calls(layers[-1]) as last, calls(layers[0]) as first:
        short = T.image_features(model, tower, pixels)
    assert first == [1] and last == [], "the block after the feature layer ran"
    assert len(short.pooler_output) == len(full.pooler_output) == 2
    for a, b in zip(short.pooler_output, full.pooler_output):
        assert torch.equal(a, b)
    assert len(short.hidden_states) == len(full.hidden_states) == len(layers) + 1
    for i, (a, b) in enumerate(zip(short.hidden_states, full.hidden_states)):  # the feature layer's is kept
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), i
    assert short.hidden_states[-2] is not None
    with calls(layers[-1]) as last:  # a block recorded past the feature layer: run up to it
        longer = T.image_features(model, tower, pixels, upto=len(layers))
    assert last == [1] and torch.equal(longer.last_hidden_state, full.last_hidden_state)
    for a, b in zip(longer.pooler_output, full.pooler_output):
        assert torch.equal(a, b)


def test_encode_runs_the_tower_only_as_far_as_it_reads(adapter):
    layers = A.encoder_layers(adapter.model.model.vision_tower)
    image = scene(80, 60, square=(20, 10, 40, 30))
    with calls(layers[-1]) as last:
        enc = adapter.encode(image, PROMPT)
    assert last == []
    pixels = adapter.processor(images=[image], text="<image>", return_tensors="pt")["pixel_values"]
    ref = adapter.model.get_image_features(pixel_values=pixels.to(adapter.dtype), return_dict=True).pooler_output
    assert torch.equal(enc.visual, torch.cat(list(ref)))  # the full tower's tokens, bit for bit
    with calls(layers[-1]) as last:  # a method reading the last block's attention: that block runs too
        rec = adapter.encode(image, PROMPT, signals=Signals(layers=frozenset({-1})))
    assert last == [1] and torch.equal(rec.visual, enc.visual)
    assert rec.signal("attention", -1).shape == (enc.n_visual + 1, enc.n_visual + 1)
    with calls(layers[-1]) as last:  # the default block's attention (the feature layer's): no extra block
        att = adapter.encode(image, PROMPT, need_attention=True)
    assert last == [] and att.attention.shape == (enc.n_visual + 1, enc.n_visual + 1)
    assert torch.equal(att.visual, enc.visual) and torch.equal(att.cls, rec.cls)


def test_the_geometry_is_built_when_first_read(adapter):
    import copy
    import pickle

    from mipruner.models.base import LazyGeometry, TokenGeometry
    from mipruner.models.llava.llava_hf import images_geometry

    image = scene(80, 60, square=(20, 10, 40, 30))
    enc = adapter.encode(image, PROMPT)
    assert isinstance(enc.geometry, LazyGeometry) and not enc.geometry.built  # nothing drawn yet
    pixels = adapter.processor(images=[image], text="<image>", return_tensors="pt")["pixel_values"]
    ref = images_geometry(adapter, [image], tuple(pixels.shape[-2:]), [enc.n_visual])
    assert len(enc.geometry) == enc.n_visual and enc.geometry.built
    for f in ("frame", "row", "col", "box"):
        assert torch.equal(getattr(enc.geometry, f), getattr(ref, f)), f
    assert (enc.geometry.kind, enc.geometry.grids, enc.geometry.sizes) == (ref.kind, ref.grids, ref.sizes)
    assert torch.equal(enc.grid, ref.grid())  # pool's input
    lazy = adapter.encode(image, PROMPT).geometry
    for g in (pickle.loads(pickle.dumps(lazy)), copy.deepcopy(adapter.encode(image, PROMPT).geometry)):
        assert type(g) is TokenGeometry and torch.equal(g.box, ref.box)  # a copy is built, then plain
    assert lazy.built


def test_the_prompt_is_tokenized_once_and_the_inputs_are_the_processors(adapter, monkeypatch):
    from mipruner.models.common.hf_adapter import expand_placeholders

    image, two = scene(80, 60, square=(20, 10, 40, 30)), [scene(56, 56, seed=1), scene(70, 56, seed=2)]
    runs = []
    real = type(adapter.tokenizer).__call__
    monkeypatch.setattr(type(adapter.tokenizer), "__call__",
                        lambda self, *a, **k: (runs.append(1), real(self, *a, **k))[1])
    enc = adapter.encode(image, PROMPT)
    assert len(runs) == 1  # the templated prompt, once (the processor would tokenize it again)
    many = adapter.encode(two, PROMPT)
    monkeypatch.undo()
    for e, images in ((enc, [image]), (many, two)):
        ref = adapter.processor(images=images, text=e.state.templated, return_tensors="pt")
        assert set(e.state.ref) == set(ref)  # the model's own inputs: the processor's, key for key
        for k in ref:
            assert torch.equal(e.state.ref[k], ref[k]), k
        assert torch.equal(e.state.input_ids, ref["input_ids"][0])
    with pytest.raises(RuntimeError, match="2 visual placeholders in the prompt for 1 images"):
        expand_placeholders([5, 9, 6, 9], [9], [3])
    assert expand_placeholders([5, 9, 6, 9, 7], [9], [2, 3]).tolist() == [5, 9, 9, 6, 9, 9, 9, 7]


def test_video_llava_images_run_the_image_tower_only_as_far_as_it_reads(tmp_path):
    a = mipruner.load(save_tiny("video_llava", str(tmp_path / "video_llava")), device="cpu")
    tower = a.model.model.image_tower
    image = scene(80, 60, square=(20, 10, 40, 30))
    with calls(A.encoder_layers(tower)[-1]) as last, calls(tower.embeddings) as passes:
        enc = a.encode(image, PROMPT)
    assert last == [] and passes == [1]
    assert not enc.geometry.built and len(enc.geometry) == enc.n_visual  # built when first read
    ref = a.model.model.get_image_features(pixel_values=enc.state.ref["pixel_values"].to(a.dtype), return_dict=True)
    assert torch.equal(enc.visual, ref.pooler_output.reshape(-1, enc.visual.shape[-1]))  # bit for bit


def test_llava_next_tokenizes_the_prompt_once_and_keeps_the_processors_inputs(tmp_path, monkeypatch):
    a = mipruner.load(save_tiny("llava_next", str(tmp_path / "llava_next")), device="cpu")
    image = scene(112, 56, square=(70, 14, 84, 28))
    runs = []
    real = type(a.tokenizer).__call__
    monkeypatch.setattr(type(a.tokenizer), "__call__", lambda self, *x, **k: (runs.append(1), real(self, *x, **k))[1])
    enc = a.encode(image, PROMPT)
    monkeypatch.undo()
    assert len(runs) == 1
    ref = a.processor(images=image, text=enc.state.templated, return_tensors="pt")
    assert set(enc.state.ref) == set(ref)
    for k in ref:
        assert torch.equal(enc.state.ref[k], ref[k]), k
