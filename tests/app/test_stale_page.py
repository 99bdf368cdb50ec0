"""Nothing on the page outlives what it describes (issue 46, section 4): a new encoding forgets the
last clicked patch, the lam slider under lam_rule "auto" shows the value auto applies (not the last
one typed), and a heatmap dims the pixels the model does not read (outside a centre crop) as the mask
does. Handlers are called with plain values (components.page.handlers), no page built."""
from __future__ import annotations

import numpy as np
from PIL import Image

from components.core.examples import load_examples
from components.core.logic import MAX_PANELS
from components.core.settings import Settings
from components.page.handlers import Handlers, Media, controls_for
from mipruner.serve.service import parameters

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
AUTO = Settings(methods=("mi", "similarity"), budget=0.25).replace(lam=0.3, lam_rule="auto")


def encode(handlers, image=IMAGE["path"], prompt=IMAGE["prompt"], settings=AUTO):
    return handlers.encode(None, Media(model="shapes-llava", image=image, prompt=prompt), controls_for(settings))


def test_a_new_encoding_forgets_the_last_clicked_patch(handlers):
    got = encode(handlers)
    patches, inspect = got.stale[:MAX_PANELS], got.stale[MAX_PANELS:]
    assert all(u["__type__"] == "update" and u["visible"] is False and u["value"] is None for u in patches)
    assert inspect == [None] * 4  # x, y, the PMI and the patch info of the Inspect section
    page = got.page_outputs()
    assert page[:len(got.outputs())] == got.outputs() and page[len(got.outputs()):] == (got.lam, *got.stale)


def test_lam_under_auto_shows_the_value_in_use(handlers):
    assert "lam" in parameters() and "lam_rule" in parameters()
    for prompt in ("is there a red circle?", "what colour is the square?"):
        got = encode(handlers, prompt=prompt)
        views, _ = handlers.logic.view(got.state, AUTO)
        applied = views[0].selection.extras["lam"]  # what MI-Pruner's panel applied
        assert views[0].method == "mi" and f"lam {applied:g} (auto" in views[0].selection.extras["lam_note"]
        assert got.state.lam_auto == applied and got.lam["value"] == applied
        assert Handlers.lam_rule(got.state, "auto")["value"] == applied
        assert Handlers.lam_rule(got.state, "auto")["interactive"] is False
        assert "value" not in Handlers.lam_rule(got.state, "fixed")  # fixed: the value shown stays
        assert Handlers.lam_rule(got.state, "fixed")["interactive"] is True
    fixed = encode(handlers, settings=AUTO.replace(lam_rule="fixed"))
    assert "value" not in fixed.lam  # the slider keeps what was typed
    assert "value" not in Handlers.lam_rule(None, "auto")  # nothing encoded: nothing known to show


def test_heatmaps_dim_what_the_model_does_not_read_as_the_masks_do(handlers, tmp_path):
    wide = tmp_path / "wide.png"
    Image.open(IMAGE["path"]).convert("RGB").resize((448, 224)).save(wide)
    got = encode(handlers, image=str(wide))
    assert "centre 224 x 224 px" in got.status
    views, _ = handlers.logic.view(got.state, AUTO.replace(budget=1.0))  # every token kept: the mask dims only the crop
    engine = handlers.logic.hub.get("shapes-llava")[0]
    lay = engine.layout(got.state.session, got.state.key)
    outside = lay.label < 0  # pixels no token covers
    inside = ~outside
    assert outside.sum() > 0.3 * outside.size  # the two side bands of a 2:1 picture
    mask, base, dimmed = np.asarray(views[0].mask), lay.base, lay.dimmed
    assert (base[outside] != dimmed[outside]).any()  # dimming changes these pixels
    assert (mask[outside] == dimmed[outside]).all()  # the mask dims them
    for v in views:
        heat = np.asarray(v.heatmap)
        assert heat.shape == mask.shape
        assert (heat[outside] == mask[outside]).all(), v.method  # dimmed as the mask dims them
        assert (heat[inside] != base[inside]).any()  # the scores painted over the tokens
