"""Malformed calls to every API endpoint, as a script or an attacker sends them (bounded: about 1,000 calls, one
session that has encoded the example image): each input of /encode, /view, /inspect, /export, /settings,
/generate and /sweep in turn replaced by a value of the wrong type, out of range, NaN, infinity, empty, huge or
nested, and calls with one value too few or too many. Every refusal carries a plain sentence (never None or
empty, never a Python exception's text such as "invalid literal for int()"), and the server keeps answering."""
from __future__ import annotations

import re

import pytest

from components.core.examples import load_examples

from .conftest import ApiSession
from .test_bad_inputs import assert_plain

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")
ENDPOINTS = ("settings", "view", "inspect", "export", "encode", "generate", "sweep")
BAD = [None, "", "abc", "NaN", -1, 0, 10**12, float("nan"), float("inf"), -1e308, [], {}, [1, "x"], {"a": 1}, True,
       "x" * 5000, [[1]]]
PYTHON_WORDING = re.compile(r"invalid literal|could not convert|object has no attribute|unsupported operand|"
                            r"NoneType|list index|not subscriptable|takes \d+ positional|\w+Error\b")


@pytest.fixture(scope="module")
def api(app_url):
    import httpx

    s = ApiSession(app_url, timeout=120)  # queue calls with any JSON (NaN included) in one session
    with open(EXAMPLE["path"], "rb") as f:
        path = httpx.post(s.url + "gradio_api/upload", files={"files": f}, timeout=30).json()[0]
    enc = list(s.defaults["encode"])
    labels = s.labels["encode"]
    enc[labels.index("Image")] = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "scene.png"}
    prompt = next(i for i, label in enumerate(labels) if (label or "").startswith("Prompt"))  # "Prompt (Enter runs it)"
    enc[prompt] = EXAMPLE["prompt"]
    ok, out = s.call("encode", enc)
    assert ok, out
    controls = enc[prompt + 1:]  # the controls, as /view takes them after the state
    s.bases = {"encode": enc, "view": [None, *controls], "export": [None, *controls],
               "inspect": [None, *controls, 10, 10], "generate": [None, *controls, 2],
               "settings": [None, "methods=mi,random budget=16"]}
    sweep = list(s.defaults["sweep"])
    at = s.labels["sweep"].index
    sweep[at("Methods")], sweep[at("Items")] = ["random"], 1
    sweep[at("Values (comma-separated; budgets: tokens, or shares in (0, 1])")] = "4"
    s.bases["sweep"] = sweep
    return s


def cases(api) -> list[tuple[str, str, list]]:
    """(endpoint, what was changed, the data): one value too few or too many, then each input replaced by
    each BAD value: every field of /view; of /encode, /inspect and /generate their own (their controls are
    /view's); of /sweep the sweep area's fields (a run on a bad value is refused before it starts)."""
    out = []
    for name in ENDPOINTS:
        base = api.bases[name]
        out += [(name, "one value too few", base[:-1]), (name, "one value too many", [*base, 1]),
                (name, "no values", [])]
        n_ctl = len(api.bases["view"])  # state + the controls: /view's fields; the others add their own
        fields = {"view": range(1, n_ctl), "encode": range(1, len(base) - n_ctl + 1),
                  "sweep": range(1, api.labels["sweep"].index("Curves (empty ones are left out)") + 1)}.get(
                      name, range(n_ctl, len(base)) if name != "settings" else range(1, 2))
        for i in fields:
            for bad in BAD:
                out.append((name, f"input {i} ({api.labels[name][i]}) = {str(bad)[:20]}", [*base[:i], bad, *base[i + 1:]]))
    return out


def test_every_malformed_call_gets_a_sentence(api):
    todo = cases(api)
    assert 500 <= len(todo) <= 1600, len(todo)  # bounded (grows with the registered methods' parameters)
    refused, problems = 0, []
    for name, what, data in todo:
        ok, out = api.call(name, data)
        if ok:
            continue
        refused += 1
        try:
            assert isinstance(out, str) and len(out.strip()) >= 6 and out.strip() != "None", out  # "set seed"
            assert not PYTHON_WORDING.search(out), out
            assert_plain(out if len(out) >= 10 else f"{out} (short)")
        except AssertionError as e:
            problems.append((name, what, str(e)[:200]))
    assert not problems, f"{len(problems)} of {refused} refusals without a sentence: {problems[:20]}"
    assert refused >= len(todo) // 3, refused  # the cases are malformed: most are refused
    ok, out = api.call("view", api.bases["view"])  # the server still answers
    assert ok, out


def test_a_sweep_of_nan_values_names_the_field(api):
    base = list(api.bases["sweep"])
    values = api.labels["sweep"].index("Values (comma-separated; budgets: tokens, or shares in (0, 1])")
    for text in ("NaN", "4, NaN", "inf", "ten"):
        base[values] = text
        ok, out = api.call("sweep", base)
        assert not ok and out.startswith("Values"), (text, out)
        assert re.search("(is not|must be) a number", out) and not PYTHON_WORDING.search(out), out
