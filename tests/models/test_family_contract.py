"""The family contract, written once and run on every row of the family table (`mipruner.models.FAMILIES`),
as timm runs one test over its model registry. Ids read `<check>[<family>-<medium or method>]`.

Each family's tiny checkpoint comes from tests/models/tiny.py. For every medium the family's adapter reads
(image, several images, video; the table's `media`):
  keep_all        keeping every visual token = the model's own forward and greedy answer (anchor.py);
  masked_prune    a pruned prefill = the model's own forward over the full sequence with the dropped
                  tokens hidden from attention (anchor.py);
  every_method    every registered method selects K tokens (K = all: all of them, in order) and answers
                  on them through `mipruner.answer`;
  encoder_signals the signals a method may ask for (`mipruner.Signals`): another block's attention equals
                  what that block gives as the adapter's default block, per-head attention averages to
                  the head mean, `features` are the projector's input rows (the projector maps them to the
                  visual tokens where it reads one row a token), and asking for more changes nothing else;
  app_panels      the app's handlers, as a user runs them (image and video): every method's panels, the
                  answers, a click and the export;
  lmms_answers    the lmms-eval model answers one item of each medium, pruned by MI and by FastV;
  family_table    the table finds the family's adapter, random-weight builder, tiny checkpoint and doc page.
What inputs the adapters build, against transformers' own processors, is test_official_table.py (the same
families, from transformers' tester configs). Per-family files keep only what is particular to a family.
"""
from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import mipruner
from mipruner.media import write_video
from mipruner.models import FAMILIES
from mipruner.pruners import get_pruner

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .anchor import assert_keep_all_is_the_unpruned_model, assert_pruned_equals_masked_full_sequence
from .tiny import TINY, save_tiny
from .tiny_llava import scene

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "What colour is the square?"
MEDIUMS = [(f, m) for f, fam in FAMILIES.items() for m in fam.media]
# The app draws the views the model reads side by side; the panel of the 120 px image is wider than this
# (OneVision: the base view and the tile canvas; InternVL: the tile canvas and the thumbnail); a video's
# frames two a row (`viz_video.video_layout`): the panel of the 12-frame 80 px clip is taller than this many
# rows of its square frames, each half the picture's width (eight frames: four rows).
IMAGE_WIDER_THAN = {"llava_onevision": 2 * 120, "internvl": 2 * 120}
VIDEO_ROWS_OVER = {"llava_onevision": 3, "internvl": 3}


def _ids(cases):
    return [f"{a}-{b}" for a, b in cases]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="module")
def files(root):
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(12)]
    scene(120, 80, square=(30, 20, 60, 50)).save(root / "pic.png")
    return {"video": write_video(frames, str(root / "clip.mp4")), "image": str(root / "pic.png")}


@pytest.fixture(scope="module")
def checkpoint(root):
    """family -> its tiny checkpoint's folder, written on first use."""
    made = {}

    def get(family: str) -> str:
        if family not in made:
            made[family] = save_tiny(family, str(root / "ckpt" / f"tiny-{family}"))
        return made[family]
    return get


@pytest.fixture(scope="module")
def adapter(checkpoint):
    loaded = {}

    def get(family: str):
        if family not in loaded:
            loaded[family] = mipruner.load(checkpoint(family), device="cpu")
        return loaded[family]
    return get


def _media(files, medium: str):
    return {"image": scene(120, 40, square=(80, 10, 100, 30)),
            "images": [scene(40, 20, seed=1), scene(30, 60, seed=2)], "video": files["video"]}[medium]


@pytest.fixture(scope="module")
def encoded(adapter, files):
    done = {}

    def get(family: str, medium: str):
        if (family, medium) not in done:
            done[family, medium] = adapter(family).encode(_media(files, medium), PROMPT, need_attention=True)
        return done[family, medium]
    return get


@pytest.mark.parametrize("family,medium", MEDIUMS, ids=_ids(MEDIUMS))
def test_keep_all(adapter, encoded, family, medium):
    assert_keep_all_is_the_unpruned_model(adapter(family), encoded(family, medium))


@pytest.mark.parametrize("family,medium", MEDIUMS, ids=_ids(MEDIUMS))
def test_masked_prune(adapter, encoded, family, medium):
    assert_pruned_equals_masked_full_sequence(adapter(family), encoded(family, medium))


METHODS = [(f, name) for f in FAMILIES for name in mipruner.list_pruners()]


@pytest.mark.parametrize("family,name", METHODS, ids=_ids(METHODS))
def test_every_method(adapter, encoded, family, name):
    a = adapter(family)
    for medium in [m for m in ("image", "video") if m in FAMILIES[family].media]:
        e = encoded(family, medium)
        k = max(2, e.n_visual // (2 if name == "fastvid" else 4))  # FastVID keeps floor(K / T) a frame: K >= T
        if get_pruner(name).video and medium == "image":  # a video method on an image: a sentence
            with pytest.raises(ValueError, match="1 frame"):
                mipruner.select(a, e, name, k, cache={})
            continue
        sel = mipruner.select(a, e, name, k, cache={})
        kept = sel.keep.numel() + (0 if sel.prefix is None else sel.prefix.shape[0])
        assert kept == k or mipruner.get_pruner(name).adaptive and 1 <= kept <= k  # adaptive: K is its cap
        assert mipruner.select(a, e, name, e.n_visual).keep.tolist() == list(range(e.n_visual))
        ans = mipruner.answer(a, e, sel, max_new_tokens=2)  # in-LLM methods run through llm_inputs
        assert 1 <= len(ans.token_ids) <= 2
        if name == "sparsevlm":  # its recycled (merged) tokens reach the LLM besides the K kept
            assert ans.visual_tokens >= k
        else:
            assert ans.visual_tokens == kept


MORE = mipruner.Signals(layers=frozenset({0, -1}), heads=frozenset({None, 0}), features=True)


@pytest.mark.parametrize("family,medium", MEDIUMS, ids=_ids(MEDIUMS))
def test_encoder_signals(adapter, encoded, files, family, medium):
    a, e = adapter(family), encoded(family, medium)
    more = a.encode(_media(files, medium), PROMPT, need_attention=True, signals=MORE)
    # asking for more changes nothing that was there; asking for nothing more records nothing more
    for name in ("visual", "text", "attention", "keys", "cls"):
        x, y = getattr(e, name), getattr(more, name)
        assert (x is None and y is None) or torch.equal(x, y), name
    assert e.features is None and set(e.blocks) == {e.encoder_block} and "attention_heads" not in e.blocks[e.encoder_block]
    assert more.signals == MORE | mipruner.Signals.of(True) and more.encoder_depth == e.encoder_depth >= 2
    depth = more.encoder_depth
    assert set(more.blocks) == {e.encoder_block, 0, depth - 1}
    # another block: what the adapter's own single-block path gives with that block as its default
    for block in (0, depth - 1):
        with _default_block(a, block):
            ref = a.encode(_media(files, medium), PROMPT, need_attention=True)
        assert ref.encoder_block == block
        assert torch.equal(more.signal("attention", block), ref.attention)
        assert torch.equal(more.signal("keys", block), ref.keys)
        assert torch.equal(more.signal("attention", block - depth), ref.attention)  # negatives count from the end
    # per head: (H, N[+1], N[+1]) float32 whose head mean is the head mean
    for layer in (None, 0):
        heads = more.signal("attention_heads", layer)
        assert heads.dtype == torch.float32 and heads.shape[1:] == more.signal("attention", layer).shape
        assert heads.shape[0] > 1 and heads.shape[0] == _heads(a)
        torch.testing.assert_close(heads.mean(0), more.signal("attention", layer), atol=1e-6, rtol=1e-5)
    # only what was asked: the last block per head only where the block giving it gives an asked one too
    # (the default or block 0; Qwen2.5-VL: windowed blocks read the nearest full-attention block)
    given = {more.blocks[b]["block"] for b in (e.encoder_block, 0)}
    assert (more.signal("attention_heads", -1) is None) == (more.blocks[depth - 1]["block"] not in given)
    if family in ("llava", "video_llava") and medium == "image":  # the tower's own output_attentions, block 0
        tower = a.model.model.vision_tower if family == "llava" else a.model.model.image_tower
        own = tower(e.state.ref["pixel_values"].to(a.device, a.dtype), output_attentions=True).attentions[0]
        torch.testing.assert_close(more.signal("attention", 0), own[0].mean(0), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(more.signal("attention_heads", 0), own[0], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match=f"encoder block {depth} does not exist"):
        a.encode(_media(files, medium), PROMPT, signals=mipruner.Signals(layers=frozenset({depth})))
    _check_features(a, more)


def _heads(a) -> int:
    vc = a.config.vision_config
    return int(getattr(vc, "num_attention_heads", None) or getattr(vc, "num_heads"))


@contextlib.contextmanager
def _default_block(a, block: int):
    """The adapter with `block` as its default attention block (its feature layer, Qwen's attention_layer)."""
    if a.family.startswith("qwen"):
        a.attention_layer, old = block, a.attention_layer
        try:
            yield
        finally:
            a.attention_layer = old
        return
    cfg = a.config
    old = cfg.vision_feature_layer
    cfg.vision_feature_layer = block + 1  # hidden_states[b + 1] is block b's output
    try:
        yield
    finally:
        cfg.vision_feature_layer = old


def _check_features(a, e):
    """`features`: one row per visual token, the projector's input; per-token projectors map them to `visual`."""
    f, kinds = e.features, e.geometry.kind
    assert f is not None and f.shape[0] == e.n_visual and f.dtype == e.visual.dtype
    newline = torch.tensor([k == "newline" for k in kinds])
    assert float(f[newline].abs().sum()) == 0.0  # tokens the tower never saw: zeros
    m = a.model.model
    if a.family.startswith("qwen"):  # each row: a token's m x m patch states side by side, as the merger reads them
        got = m.visual.merger(f.reshape(f.shape[0] * a.merge ** 2, -1))  # (N_V * m*m, D) -> (N_V, d)
    elif a.family == "llava_onevision" and e.is_video:  # pooled after the projector: features are pooled likewise
        pixels = e.state.ref["pixel_values_videos"][0].to(a.device, a.dtype)  # (F, 3, H, W)
        hidden = m.vision_tower(pixels, output_hidden_states=True).hidden_states[a.config.vision_feature_layer]
        hidden = hidden[:, 1:] if a.config.vision_feature_select_strategy == "default" else hidden
        torch.testing.assert_close(f[~newline], m.apply_pooling(hidden).flatten(0, 1), atol=1e-6, rtol=1e-5)
        return
    else:
        got = m.multi_modal_projector(f)
    torch.testing.assert_close(got[~newline], e.visual[~newline], atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def app(root):
    from components.core.logic import AppLogic
    from components.hosting.hub import ModelHub
    from components.hosting.policy import ModelPolicy

    hub = ModelHub("shapes-llava", device="cpu", policy=ModelPolicy(model_dirs=(str(root / "ckpt"),)))
    hub.load_default()
    return AppLogic(hub, max_new_tokens=3)


PANELS = [(f, m) for f, m in MEDIUMS if m in ("image", "video")]


@pytest.mark.parametrize("family,kind", PANELS, ids=_ids(PANELS))
def test_app_panels(app, checkpoint, files, family, kind):
    from components.core.settings import Settings

    path = checkpoint(family)
    # every view (a CPU app reads an anyres image as its base view by default: tests/app/test_fewer_views.py)
    st, msg = app.encode(None, path, kind, files["image"] if kind == "image" else None,
                         files["video"] if kind == "video" else None, PROMPT, fewer_views=False)
    assert f"tiny-{family}" in msg and "instead" not in msg
    names = mipruner.list_pruners()
    for i in range(0, len(names), 3):
        views, summary = app.view(st, Settings(methods=tuple(names[i:i + 3]), budget=0.25))
        for v in views:
            if v.selection is None:  # a video method on an image: its panel says so, the others run
                assert kind == "image" and get_pruner(v.method).video and "does not apply here" in v.error
                continue
            adaptive = get_pruner(v.method).adaptive  # FastVID may keep fewer: the budget is its cap
            assert (abs(v.kept - 0.25 * st.n_visual) <= 1 or adaptive and 1 <= v.kept <= 0.25 * st.n_visual + 1) \
                and len(v.selection.keep) <= v.kept
            w, h = v.mask.size
            assert np.asarray(v.heatmap).shape[:2] == (h, w)
            assert np.asarray(v.mask).std() > 0  # something is drawn
    if kind == "image":
        assert w > IMAGE_WIDER_THAN.get(family, 0)
    else:
        assert h > VIDEO_ROWS_OVER.get(family, 0) * w / 2
    out = app.generate(st, Settings(methods=("mi", "fastv"), budget=0.25), 3)
    assert out["reference"]["visual_tokens"] == st.n_visual
    assert app.inspect(st, Settings(methods=("mi",), budget=0.25), w * 0.3, h * 0.3)["token"] is not None
    exported = app.export(st, Settings(methods=("mi",), budget=0.25), app.new_export_dir())
    assert any(f.endswith("mi_mask.png") for f in exported)


LMMS = [(f, m) for f in FAMILIES for m in ("mi", "fastv")]


@pytest.mark.parametrize("family,method", LMMS, ids=_ids(LMMS))
def test_lmms_answers(checkpoint, root, family, method):
    pytest.importorskip("lmms_eval")
    from mipruner.lmms.model import MiPruner

    video = write_video([scene(48, 32, seed=i) for i in range(6)], str(root / f"lmms-{family}-{method}.mp4"))
    items = {"image": [scene(60, 40)], "images": [scene(30, 30, seed=1), scene(40, 20, seed=2)], "video": [video]}
    docs = dict(enumerate(items[m] for m in FAMILIES[family].media))
    model = MiPruner(pretrained=checkpoint(family), method=method, budget="25%", device="cpu")
    assert model.adapter.family == family
    model.task_dict = {"t": {"test": docs}}
    reqs = [SimpleNamespace(args=(PROMPT, {"max_new_tokens": 2, "until": []}, lambda doc: doc, i, "t", "test"))
            for i in docs]
    out = model.generate_until(reqs)
    assert len(out) == len(docs) and all(isinstance(t, str) for t in out) and model.calls == len(docs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_table(family):
    from components.hosting.hub import SUGGESTED

    fam = FAMILIES[family]
    assert os.path.isdir(os.path.join(ROOT, "mipruner", "models", fam.folder))
    cls = fam.adapter_class()
    assert issubclass(cls, mipruner.models.Adapter) and cls.__module__.startswith(f"mipruner.models.{fam.folder}.")
    builder = fam.builder_function()
    assert callable(builder) and builder.__module__.startswith(f"mipruner.models.{fam.folder}.")
    assert family in TINY
    with open(os.path.join(ROOT, fam.doc)) as f:
        assert f"`{family}`" in f.read(), f"{fam.doc} does not name `{family}`"
    assert fam.suggested and set(fam.suggested) <= set(SUGGESTED)


def test_the_family_table_is_the_only_list():
    """The bench's zoo and tester table are the family table's rows, not lists of their own."""
    from . import tester_models

    assert list(tester_models.FAMILIES) == list(FAMILIES)
    assert set(TINY) == set(FAMILIES)
