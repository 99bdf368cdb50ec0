"""Invalid API inputs, as a script or an attacker sends them: each gets one plain sentence that names the
field (not Gradio's wording, not its generic error), whatever the session did before, and no message
quotes more than about 100 characters of any input."""
from __future__ import annotations

import re

import pytest

from components.core.logic import MAX_PANELS
from components.core.settings import Settings
from components.page.controls import control_names, control_values

from .test_bad_inputs import EXAMPLE, Raw, assert_plain

CTL = control_values(Settings(methods=("mi", "random"), budget=16), 196)
AT = control_names().index
GRADIO_WORDING = ("Value ", "is not in the list of choices", "less than minimum", "greater than maximum")


def with_(**changes) -> list:
    vals = list(CTL)
    for name, value in changes.items():
        vals[AT(name)] = value
    return vals


def assert_sentence(msg, field: str, longest_input_run: int = 100) -> None:
    """A plain message that starts with the field's name and quotes no long run of an input."""
    assert_plain(msg)
    assert msg.startswith(field), (field, msg)
    assert not any(w in msg for w in GRADIO_WORDING), msg
    assert not re.search(r"(.)\1{%d,}" % longest_input_run, msg), msg[:300]


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def error_of(fn):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as e:
        fn()
    return str(e.value)


def encode_with(client, image, model="shapes-llava"):
    return client.predict(model, "", "image", image, None, EXAMPLE["prompt"], *CTL, api_name="/encode")


def test_files_from_the_web_or_never_uploaded_are_named(app_url, client):
    from gradio_client import handle_file

    msg = error_of(lambda: encode_with(client, handle_file("https://example.com/cat.png")))
    assert_sentence(msg, "image: this server does not fetch files from the web")
    raw = Raw(app_url)
    for path in ("/tmp/gradio/never-uploaded/cat.png", "http://127.0.0.1:1/x.png"):
        ok, msg = raw.call("encode", ["shapes-llava", "", "image", {"path": path, "meta": {"_type": "gradio.FileData"}},
                                      None, EXAMPLE["prompt"], *CTL])
        assert not ok
        assert_sentence(msg, "image: ")
    assert "cat.png" in msg or "web" in msg


@pytest.mark.parametrize("first_unit", ["%", "tokens"])
def test_a_budget_out_of_range_is_named_in_either_unit_whatever_came_before(app_url, first_unit):
    """The session's last /encode set the slider's range for its unit; the API's budget is checked against
    the unit sent with it, so the sentence is the same after either."""
    from gradio_client import Client, handle_file

    client = Client(app_url, verbose=False)
    encode_with(client, handle_file(EXAMPLE["path"]))
    client.predict(*with_(unit=first_unit, budget=10), api_name="/view")
    cases = {("%", 0): "budget in % must be in (0, 100], got 0", ("%", 101): "budget in % must be in (0, 100], got 101",
             ("tokens", 0): "budget in tokens must be at least 1, got 0",
             ("tokens", -5): "budget in tokens must be at least 1, got -5"}
    for (unit, value), want in cases.items():
        msg = error_of(lambda: client.predict(*with_(unit=unit, budget=value), api_name="/view"))
        assert_sentence(msg, "budget")
        assert msg == want
    out = client.predict(*with_(unit="tokens", budget=150), api_name="/view")[-2]  # in range for tokens, not %
    assert [m["kept"] for m in out["methods"]] == [150, 150]


def test_unknown_choices_and_too_many_methods_are_named(app_url, client):
    from gradio_client import handle_file

    encode_with(client, handle_file(EXAMPLE["path"]))
    for field, value in (("methods", ["mi", "nosuch"]), ("methods", ["x" * 5000]), ("text_mode", "bogus"),
                         ("unit", "bytes")):
        msg = error_of(lambda: client.predict(*with_(**{field: value}), api_name="/view"))
        assert_sentence(msg, f"{field}: ")
    seven = ["mi", "random", "similarity", "attention", "divprune", "fastv", "dart"][:MAX_PANELS + 1]
    from_view = error_of(lambda: client.predict(*with_(methods=seven), api_name="/view"))
    from_settings = error_of(lambda: client.predict("m=" + ",".join(seven), api_name="/settings"))
    assert from_view == from_settings == f"methods: choose at most {MAX_PANELS} at once, got {MAX_PANELS + 1}"


def test_no_message_echoes_a_long_input(client):
    from gradio_client import handle_file

    msg = error_of(lambda: client.predict("m=" + "x" * 900_000, api_name="/settings"))
    assert_plain(msg)
    assert len(msg) < 700 and "x" * 101 not in msg
    msg = error_of(lambda: client.predict("zz" * 450_000 + "=1", api_name="/settings"))
    assert len(msg) < 700 and "z" * 101 not in msg
    status = encode_with(client, handle_file(EXAMPLE["path"]), model="m" * 200_000)[0]
    assert "m" * 101 not in status and len(status) < 1500 and "196 visual tokens" in status
