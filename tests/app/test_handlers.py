"""The page's handlers called with plain values, no page built (components.page.handlers): what each returns
for a normal input, and the sentence it raises for a bad one."""
from __future__ import annotations

import gradio as gr
import pytest

from components.core.examples import load_examples
from components.core.logic import MAX_PANELS, UIState, UserError
from components.core.settings import Settings
from components.page import controls as C
from components.page.handlers import Handlers, Media, controls_for, controls_of, token_chips
from components.page.panels import PANEL_FIELDS
from mipruner.serve.service import method_spec, method_specs, parameters

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
SETTINGS = Settings(methods=("mi", "random"), budget=0.25)


@pytest.fixture(scope="module")
def encoded(handlers):
    return handlers.encode(None, Media(model="shapes-llava", image=IMAGE["path"], prompt=IMAGE["prompt"]),
                           controls_for(SETTINGS))


def test_controls_by_name_round_trip_the_settings():
    vals = controls_for(SETTINGS)
    assert list(vals) == C.control_names() and vals["methods"] == ["mi", "random"]
    assert vals["unit"] == "%" and vals["budget"] == 25.0
    assert Handlers.settings(None, vals) == SETTINGS
    with pytest.raises(UserError, match="expected .* control values, got 2"):
        controls_of(["mi", "%"])
    with pytest.raises(UserError, match=r"budget in % must be in \(0, 100\], got 250"):
        Handlers.settings(None, {**vals, "budget": 250})


def test_encode_gives_the_state_the_status_and_the_controls_ranges(encoded):
    st = encoded.state
    assert isinstance(st, UIState) and st.n_visual > 0 and st.tokens
    assert f"{st.n_visual} visual tokens" in encoded.status
    assert encoded.tokens == token_chips(st.tokens, -1) and all(mark is None for _, mark in encoded.tokens)
    assert encoded.budget["minimum"] == 1 and encoded.budget["maximum"] == 100 and encoded.budget["value"] == 25.0
    assert encoded.heat["value"] == -1
    layers = [n for n in parameters() if n == "layer"]
    assert [u["maximum"] for u in encoded.layers] == [st.n_layers] * len(layers)
    assert encoded.outputs()[:3] == (st, encoded.status, encoded.tokens) and len(encoded.outputs()) == 5 + len(layers)


def test_encode_refuses_an_empty_prompt_and_a_missing_picture(handlers):
    with pytest.raises(UserError, match="the prompt is empty"):
        handlers.encode(None, Media(model="shapes-llava", image=IMAGE["path"], prompt="  "), controls_for(SETTINGS))
    with pytest.raises(UserError, match="no image given"):
        handlers.encode(None, Media.of("shapes-llava", "", "image", None, None, "what is red?"),
                        controls_for(SETTINGS))


def test_view_fills_one_panel_per_method_and_hides_the_rest(handlers, encoded):
    st = encoded.state
    v = handlers.view(st, controls_for(SETTINGS.replace(heat=1)))
    assert len(v.fields) == MAX_PANELS * PANEL_FIELDS
    visible = [props.get("visible") for props, _ in v.fields[::PANEL_FIELDS]]  # each panel's title
    assert visible == [True, True] + [False] * (MAX_PANELS - 2)
    assert v.fields[0][1].startswith(f"### {method_spec('mi').label}\n") and "tokens kept" in v.fields[0][1]
    assert Settings.parse(v.settings) == SETTINGS.replace(heat=1)
    assert [m["method"] for m in v.summary["methods"]] == ["mi", "random"]
    assert v.summary["heat_token"] == st.tokens[1] and v.tokens == token_chips(st.tokens, 1)
    assert v.reference == "**Unpruned reference:** *not generated yet*"  # a view never runs the LLM
    full = v.outputs()
    assert len(full) == MAX_PANELS * PANEL_FIELDS + 4 and all(u["__type__"] == "update" for u in full[:len(v.fields)])


def test_view_refuses_no_encoding_and_too_many_methods(handlers, encoded):
    with pytest.raises(UserError, match="run the model first"):
        handlers.view(None, controls_for(SETTINGS))
    seven = [s.name for s in method_specs()][:MAX_PANELS + 1]
    assert len(seven) == MAX_PANELS + 1
    with pytest.raises(UserError, match=f"methods: choose at most {MAX_PANELS} at once, got {MAX_PANELS + 1}"):
        handlers.view(encoded.state, {**controls_for(SETTINGS), "methods": seven})


def test_live_sends_props_only_where_they_changed(handlers, encoded):
    st, vals = encoded.state, controls_for(SETTINGS)
    first = handlers.live(st, vals, ask=3, raw=5, raw_open=False, auto=True)
    assert first.ask == 4 and first.raw == 5  # answers follow; the raw data is closed
    assert all(isinstance(u, dict) and u["__type__"] == "update" for u in first.panels)
    again = handlers.live(st, vals, shown=first.shown, ask=first.ask, raw=first.raw, raw_open=True, auto=False)
    assert again.ask == 4 and again.raw == 6
    assert not any(isinstance(u, dict) and u.get("__type__") == "update" for u in again.panels)  # bare values
    assert again.shown["props"] == first.shown["props"] and len(again.outputs()) == len(first.panels) + 6


def test_inspect_scales_the_patch_pmi_and_asks_for_a_point(handlers, encoded):
    st = encoded.state
    engine = handlers.logic.hub.get("shapes-llava")[0]
    x0, y0, x1, y1 = engine.layout(st.session, st.key).rects[0]
    got = handlers.inspect(st, controls_for(SETTINGS), (x0 + x1) / 2, (y0 + y1) / 2)
    assert got.info["token"] == 0 and [t for t, _ in got.tokens] == st.tokens
    scaled = [v for _, v in got.tokens]
    assert all(0 <= v <= 1 for v in scaled) and (min(scaled), max(scaled)) == (0, 1)
    with pytest.raises(UserError, match="give the x and y of a patch"):
        handlers.inspect(st, controls_for(SETTINGS), None, 3)
    with pytest.raises(UserError, match="no visual token"):
        handlers.inspect(st, controls_for(SETTINGS), -5, -5)


def test_generate_answers_every_panel_and_the_reference(handlers, encoded):
    ans = handlers.generate(encoded.state, controls_for(SETTINGS), 2)
    assert set(ans.answers["methods"]) == {"mi", "random"} and ans.answers["reference"]["new_tokens"] <= 2
    assert [u.get("visible") for u in ans.panels[:2]] == [True, True] and ans.panels[2] == gr.update()
    assert ans.reference.startswith("**Unpruned reference answer:**")
    bare = handlers.generate(encoded.state, controls_for(SETTINGS), 2, bare=True)
    assert all(isinstance(p, str) for p in bare.panels[:2]) and bare.panels[2:] == [None] * (MAX_PANELS - 2)
    assert Handlers.encoded(encoded.state) and not Handlers.encoded(None)
    assert Handlers.no_answers().outputs() == (*[None] * MAX_PANELS, "**Unpruned reference:** *not generated yet*",
                                               None)


def test_apply_sets_the_controls_or_names_the_bad_field():
    got = Handlers.apply(None, SETTINGS.replace(budget=12).to_string())
    assert list(got) == C.control_names() and got["methods"] == ["mi", "random"] and got["unit"] == "tokens"
    assert got["budget"]["value"] == 12 and "range follows the image" in got["budget"]["label"]
    with pytest.raises(UserError, match="budget"):
        Handlers.apply(None, SETTINGS.to_string().replace("b=0.25", "b=-3"))
    many = ",".join(s.name for s in method_specs()[:MAX_PANELS + 1])
    with pytest.raises(UserError, match=f"choose at most {MAX_PANELS}"):
        Handlers.apply(None, SETTINGS.to_string().replace("m=mi,random", f"m={many}"))


def test_the_small_handlers_without_an_encoding(encoded):
    assert Handlers.token(None, 0) == -1 and Handlers.token(encoded.state, [1, "x"]) == 1
    assert Handlers.token(encoded.state, len(encoded.state.tokens)) == -1
    assert Handlers.chips(None, None) == [] and Handlers.chips(encoded.state, 0)[0][1] == "shown"
    assert Handlers.unit(None, "%")["maximum"] == 100
    assert Handlers.unit(encoded.state, "tokens")["maximum"] == encoded.state.n_visual
    assert Handlers.frame_range(None) == gr.update(visible=False, maximum=1, value=0)
    assert Handlers.frame_range(encoded.state)["visible"] is False  # one image: no frame selector
