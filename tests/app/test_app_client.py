"""The running app driven through its API with gradio_client, as a user's script would: encode,
move sliders, generate, inspect, export, settings; and two sessions that never see each other."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from components.core.examples import load_examples
from components.core.settings import Settings
from components.page.controls import control_names, control_values

IMAGES = [e for e in load_examples() if e["kind"] == "image"]


def ctl(**kw) -> list:
    """Control values for a Settings (the API's positional parameters after the media inputs)."""
    return control_values(Settings(**kw), 196)


@pytest.fixture()
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def encode(client, example, **kw):
    from gradio_client import handle_file

    return client.predict("shapes-llava", "", "image", handle_file(example["path"]), None, example["prompt"],
                          *ctl(**kw), api_name="/encode")


def view(client, **kw) -> dict:
    out = client.predict(*ctl(**kw), api_name="/view")
    return out[-2]  # the view JSON: methods, kept indices, settings string


def mask_pixels(client, **kw) -> np.ndarray:
    out = client.predict(*ctl(**kw), api_name="/view")
    img = out[1]["value"] if isinstance(out[1], dict) else out[1]  # panel 0's mask (an update: it also shows)
    return np.asarray(Image.open(img).convert("RGB"))


def test_api_lists_one_endpoint_per_action(client):
    eps = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert set(eps) == {"/encode", "/view", "/generate", "/inspect", "/export", "/settings", "/sweep", "/sweep_strip"}
    names = [p["parameter_name"] for p in eps["/view"]["parameters"]]
    assert names == control_names()


def test_encode_then_sliders_change_the_view(client):
    status, tokens, *_ = encode(client, IMAGES[0])
    assert "196 visual tokens" in status
    assert [t["token"].strip() for t in tokens] == IMAGES[0]["prompt"].replace("?", " ?").split()
    base = dict(methods=("mi", "random", "similarity"), budget=16, lam_rule="fixed")  # lam as set, not auto
    v16 = view(client, **base)
    assert [m["kept"] for m in v16["methods"]] == [16, 16, 16]
    v40 = view(client, **{**base, "budget": 40})
    assert [m["kept"] for m in v40["methods"]] == [40, 40, 40]
    # the mask image follows: more kept patches, more bright pixels
    m16 = mask_pixels(client, **base).astype(int).sum()
    m40 = mask_pixels(client, **{**base, "budget": 40}).astype(int).sum()
    assert m40 > m16
    # lambda changes MI's selection, not Random's
    lam1 = view(client, **{**base, "lam": 1.0})
    assert lam1["methods"][0]["keep"] != v16["methods"][0]["keep"]
    assert lam1["methods"][1]["keep"] == v16["methods"][1]["keep"]
    # a share budget
    vs = view(client, **{**base, "budget": 0.25})
    assert vs["methods"][0]["kept"] == 49 and "b=0.25" in vs["settings"]


def test_generate_answers_with_token_counts(client):
    encode(client, IMAGES[1])
    out = client.predict(*ctl(methods=("mi", "random"), budget=20), 4, api_name="/generate")
    answers = out[-1]
    assert answers["reference"]["visual_tokens"] == 196
    assert answers["methods"]["mi"]["visual_tokens"] == 20 == answers["methods"]["random"]["visual_tokens"]
    assert answers["methods"]["mi"]["input_tokens"] == answers["reference"]["input_tokens"] - 176
    panel0 = out[0]["value"] if isinstance(out[0], dict) else out[0]
    assert "Answer" in panel0 and answers["methods"]["mi"]["text"] in panel0


def test_inspect_export_and_settings(client):
    encode(client, IMAGES[2])
    info = client.predict(*ctl(methods=("mi",), budget=16), 56.0, 56.0, api_name="/inspect")[1]
    assert 0 <= info["token"] < 196 and len(info["pmi"]) == len(IMAGES[2]["prompt"].replace("?", " ?").split())
    files = client.predict(*ctl(methods=("mi",), budget=16), api_name="/export")
    names = sorted(p.rsplit("/", 1)[-1] for p in files)
    assert names == ["mi_heatmap.png", "mi_mask.png", "mi_pivots.png", "mi_selection.json", "view.json"]
    doc = json.load(open(next(p for p in files if p.endswith("mi_selection.json"))))
    assert len(doc["keep"]) == 16
    s = Settings(methods=("cdpruner", "mi"), budget=24, lam=0.3, theta=0.7)
    vals = client.predict(s.to_string(), api_name="/settings")
    at = control_names().index
    assert vals[at("methods")] == ["cdpruner", "mi"] and vals[at("unit")] == "tokens"
    assert vals[at("lam")] == pytest.approx(0.3) and vals[at("theta")] == pytest.approx(0.7)


def test_errors_reach_the_client(client):
    from gradio_client import handle_file

    with pytest.raises(Exception, match="prompt is empty"):
        client.predict("shapes-llava", "", "image", handle_file(IMAGES[0]["path"]), None, "  ", *ctl(),
                       api_name="/encode")
    from gradio_client import Client

    fresh = Client(client.src, verbose=False)
    with pytest.raises(Exception, match="run the model first"):
        fresh.predict(*ctl(), api_name="/view")


def test_unloadable_model_falls_back_plainly(client):
    from gradio_client import handle_file

    status, *_ = client.predict("shapes-llava", "nobody/no-such-model", "image", handle_file(IMAGES[0]["path"]),
                                None, IMAGES[0]["prompt"], *ctl(), api_name="/encode")
    assert "Could not load 'nobody/no-such-model'" in status and "embedded model 'shapes-llava'" in status
    assert "196 visual tokens" in status  # and the page goes on with the embedded model


def test_no_file_access_beyond_assets_and_uploads(client):
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in ("/etc/hostname", os.path.join(root, "README.md")):
        with pytest.raises(Exception):
            client.predict("shapes-llava", "", "image", {"path": path, "meta": {"_type": "gradio.FileData"}}, None,
                           "is there a red circle?", *ctl(), api_name="/encode")
    status, *_ = client.predict("shapes-llava", "", "image", {"path": IMAGES[0]["path"],
                                "meta": {"_type": "gradio.FileData"}}, None, IMAGES[0]["prompt"], *ctl(),
                                api_name="/encode")
    assert "196 visual tokens" in status  # assets/ is served


def test_two_sessions_never_see_each_other(app_url, hub):
    from gradio_client import Client

    def keeps(v):
        return [m["keep"] for m in v["methods"]]

    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    encode(a, IMAGES[0])
    va = view(a, methods=("mi",), budget=12)
    encode(b, IMAGES[3])
    vb = view(b, methods=("mi",), budget=12)
    assert keeps(va) != keeps(vb)
    # each session keeps showing its own image's selection after the other one worked
    assert keeps(view(a, methods=("mi",), budget=12)) == keeps(va)
    assert keeps(view(b, methods=("mi",), budget=12)) == keeps(vb)
    # answers too: each session's reference answer is the model's answer for its own image
    adapter = hub.get("shapes-llava")[0].adapter
    for client, ex in ((a, IMAGES[0]), (b, IMAGES[3])):
        got = client.predict(*ctl(methods=("mi",), budget=12), 4, api_name="/generate")[-1]["reference"]
        want = adapter.generate(adapter.encode(ex["path"], ex["prompt"]), max_new_tokens=4)
        assert (got["text"], got["input_tokens"]) == (want.text, want.input_tokens)
    # a third session starts empty
    c = Client(app_url, verbose=False)
    with pytest.raises(Exception, match="run the model first"):
        c.predict(*ctl(), api_name="/view")


def test_docs_api_snippet_runs(app_url, capsys):
    """The gradio_client snippet in docs/app.md, run as written against the live server."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    page = open(os.path.join(root, "docs", "app.md")).read()
    code = re.search(r"<!-- api-snippet -->\s*```python\n(.*?)```", page, re.S).group(1)
    code = code.replace('"http://127.0.0.1:7860/"', repr(app_url)).replace(
        '"assets/examples/scene_3.png"', repr(os.path.join(root, "assets/examples/scene_3.png")))
    exec(compile(code, "docs/app.md", "exec"), {})
    out = capsys.readouterr().out
    assert "196 visual tokens" in out and "('mi', 32)" in out and "('fastv', 32)" in out
