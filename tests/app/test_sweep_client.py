"""The Sweep area through the running app's API (gradio_client), as a user's script would: a small
budget sweep on a generated POPE set, its files and points, the session cache, a zip of one's own,
and the kept-mask strip of the image on screen."""
from __future__ import annotations

import csv
import json
import time
import zipfile

import pytest

from components.core.examples import load_examples
from components.core.settings import Settings
from components.page.controls import control_values

IMAGE = next(e for e in load_examples() if e["kind"] == "image")


def page(**kw) -> list:
    return control_values(Settings(**kw), 196)


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def sweep(client, methods, param, values, qset="pope", n=6, zip_file=None, x="value", **page_kw):
    from gradio_client import handle_file

    z = handle_file(zip_file) if zip_file else None
    return client.predict(list(methods), param, values, 16, qset, n, 1234, z, None, x, ["acc", "f1", "kept"],
                          "shapes-llava", "", *page(**page_kw), api_name="/sweep")


def test_budget_sweep_through_the_api(client):
    names = [p["parameter_name"] for p in client.view_api(return_format="dict", print_info=False)
             ["named_endpoints"]["/sweep"]["parameters"]]
    assert names[:13] == ["sweep_methods", "sweep_param", "sweep_values", "sweep_budget", "question_set", "n_items",
                          "set_seed", "zip", "questions", "x", "metrics", "model", "model_path"]
    status, plot, files, table = sweep(client, ("mi", "random", "similarity"), "budget", "4,16")
    assert "Sweep done" in status and "6 items" in status and "6 encodings" in status
    assert plot and plot.get("type") == "matplotlib" and plot["plot"].startswith("data:image/png")
    by_ext = {f.rsplit(".", 1)[1]: f for f in files}
    assert set(by_ext) == {"csv", "json", "png"}
    rows = [r for r in csv.DictReader(open(by_ext["csv"])) if r["split"] == "average"]
    assert {(r["method"], r["value"]) for r in rows} >= {("mi", "4"), ("mi", "16"), ("random", "4"),
                                                         ("similarity", "16")}
    doc = json.load(open(by_ext["json"]))
    assert doc["n_items"] == 6 and doc["sweep"]["values"] == [4, 16] and doc["sweep"]["params"] == {}
    # POPE at the defaults: lambda auto applied 1 to every (yes/no) question
    assert {r["lam"] for r in doc["records"] if r["method"] == "mi"} == {1.0}
    data = table["data"]
    assert [r[0] for r in data] == ["unpruned", "MI-Pruner", "MI-Pruner", "Random", "Random", "Similarity",
                                    "Similarity"]
    assert [r[6] for r in data[1:3]] == [4.0, 16.0]  # mean tokens kept
    # the same sweep again comes from this session's cache
    t = time.perf_counter()
    status2, *_ = sweep(client, ("mi", "random", "similarity"), "budget", "4,16")
    assert "from this session's cache" in status2 and time.perf_counter() - t < 30


def test_own_zip_and_a_parameter_sweep(client, tmp_path):
    z = tmp_path / "mine.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.write(IMAGE["path"], "pics/scene.png")
        zf.writestr("questions.jsonl", "\n".join(json.dumps(r) for r in [
            {"media": "pics/scene.png", "question": IMAGE["prompt"], "answer": "yes"},
            {"media": "pics/scene.png", "question": "is there a green circle?", "answer": "no"}]))
    status, plot, files, table = sweep(client, ("mi", "random"), "aggregation", "max,mean", qset="my own (zip)",
                                       n=10, zip_file=str(z))
    assert "2 items of mine.zip" in status
    doc = json.load(open(next(f for f in files if f.endswith(".json"))))
    assert doc["sweep"]["param"] == "aggregation" and doc["set_info"]["yesno"] == 2
    rows = {(r["method"], r["value"]): r for r in doc["rows"] if r["split"] == "all"}
    assert rows[("random", "max")]["varies"] is False and rows[("mi", "mean")]["varies"] is True
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="upload a zip"):
        sweep(client, ("mi",), "budget", "4", qset="my own (zip)")
    with pytest.raises(AppError, match="lam must be in"):
        sweep(client, ("mi",), "lam", "0.5,2")


def test_strip_of_the_image_on_screen(client):
    from gradio_client import handle_file

    client.predict("shapes-llava", "", "image", handle_file(IMAGE["path"]), None, IMAGE["prompt"], *page(),
                   api_name="/encode")
    img, md = client.predict(["mi", "similarity"], "budget", "4,8,16", 16, "pope", 6, 1234, None, None, *page(),
                             api_name="/sweep_strip")
    assert img and "IoU" in md and "4 -> 8" in md and "| Similarity |" in md
