"""Bad inputs through the running app's API: every one gets a plain message (no Gradio generic error,
no server path, no error number, no exception name), the ones a user may reasonably send still work
(with a warning where the model cannot read them), and the server answers normally afterwards.

Files are built in a temporary folder; NaN and infinity go through a raw queue call (gradio_client,
like any strict JSON encoder, refuses to send them, but Python's JSON reader on the server takes them).
"""
from __future__ import annotations

import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from components.core.examples import load_examples
from components.core.settings import Settings
from components.page.controls import control_names, control_values
from mipruner.media import write_video

from .conftest import ApiSession

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")
CTL = control_values(Settings(methods=("mi", "random"), budget=16), 196)
NUMERIC = [n for n, v in zip(control_names(), CTL) if isinstance(v, (int, float)) and not isinstance(v, bool)]
NOT_PLAIN = ("upstream Gradio app", "verbose error", "Traceback", "Errno", "JSON compliant", "/tmp/", "gradio/")


def assert_plain(msg) -> None:
    assert isinstance(msg, str) and 10 <= len(msg) <= 1200, msg
    assert not any(s in msg for s in NOT_PLAIN), msg
    assert not re.search(r"\b\w*(Error|Exception)\b", msg), msg  # no exception class names
    assert not re.search(r"(?<![\w:/.])/(\w[\w.-]*/){2,}", msg), msg  # no absolute server paths


# ------------------------------------------------------------------------------------ bad files

def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_header_only(w: int, h: int, idat: bytes) -> bytes:
    """A 1-bit greyscale PNG of w x h whose pixel data is `idat` (for sizes PIL will not build)."""
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))


def _bomb(side: int = 30_000) -> bytes:
    """A real side x side black PNG, about 110 kB on disk, 900 megapixels once decoded."""
    z = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    return _png_header_only(side, side, b"".join(z.compress(row) for _ in range(side)) + z.flush())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    out = {}

    def put(name, data: bytes):
        (d / name).write_bytes(data)
        out[name] = str(d / name)

    put("text.png", b"this is a text file, not a picture\n")
    put("bomb.png", _bomb())
    put("zero.png", _png_header_only(0, 0, zlib.compress(b"")))
    put("empty.mp4", b"")
    put("corrupt.mp4", rng.integers(0, 255, 4096, dtype=np.uint8).tobytes())
    picture.save(d / "whole.jpg", quality=90)
    put("truncated.jpg", (d / "whole.jpg").read_bytes()[:600])
    Image.new("RGB", (1, 1), (200, 30, 30)).save(d / "one.png")
    out["one.png"] = str(d / "one.png")
    frames = [Image.new("RGB", (48, 48), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    frames[0].save(d / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out["animated.gif"] = str(d / "animated.gif")
    Image.fromarray((rng.random((40, 40)) * 65535).astype(np.uint16)).save(d / "deep16.png")
    assert Image.open(d / "deep16.png").mode.startswith("I;16")
    out["deep16.png"] = str(d / "deep16.png")
    picture.convert("CMYK").save(d / "cmyk.jpg")
    out["cmyk.jpg"] = str(d / "cmyk.jpg")
    out["one_frame.mp4"] = write_video([picture], d / "one_frame.mp4", fps=4)
    import av

    with av.open(str(d / "audio_only.mp4"), "w") as c:  # a valid MP4 with only a sound track
        s = c.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for p in [*s.encode(frame), *s.encode()]:
            c.mux(p)
    out["audio_only.mp4"] = str(d / "audio_only.mp4")
    return out


# ------------------------------------------------------------------------------------ API access

@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


class Raw(ApiSession):
    """Queue calls with any JSON (NaN and Infinity included), in one session (`session_hash`)."""

    def call(self, api: str, data: list, timeout: float = 60) -> tuple[bool, object]:
        """(success, output data | error message); the state input (first) is filled with None."""
        return super().call(api, [None, *data], timeout)


def encode(client, image=None, video=None, prompt=EXAMPLE["prompt"]):
    """(ok, status or error message) of /encode with these inputs."""
    from gradio_client import handle_file

    try:
        out = client.predict("shapes-llava", "", "video" if video else "image", handle_file(image) if image else None,
                             handle_file(video) if video else None, prompt, *CTL, api_name="/encode")
        return True, out[0]
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return False, str(e)


# ------------------------------------------------------------------------------------ the cases

# file or prompt -> ("error" | "ok", what the message or the status must say)
MEDIA_CASES = {
    "text.png": ("error", "not a picture"),
    "bomb.png": ("error", "too large to open safely"),
    "zero.png": ("error", "not a picture"),
    "empty.mp4": ("error", "empty"),
    "corrupt.mp4": ("error", "cannot read video 'corrupt.mp4'"),
    "truncated.jpg": ("error", "incomplete or damaged"),
    "audio_only.mp4": ("error", "no video stream"),
    "one.png": ("ok", "196 visual tokens"),
    "animated.gif": ("ok", "visual tokens"),
    "deep16.png": ("ok", "196 visual tokens"),
    "cmyk.jpg": ("ok", "196 visual tokens"),
    "one_frame.mp4": ("ok", "1 frame ->"),
}


def test_bad_inputs_get_plain_messages_and_the_server_keeps_answering(app_url, client, files):
    seen = 0

    def check(ok, msg, want, must):
        nonlocal seen
        seen += 1
        assert_plain(msg)
        assert ok == (want == "ok") and must in msg, (want, must, msg)

    for name, (want, must) in MEDIA_CASES.items():
        video = files[name] if name.endswith(".mp4") else None
        check(*encode(client, image=None if video else files[name], video=video), want, must)
    check(*encode(client, image=files["one_frame.mp4"]), "error", "not a picture")  # a video in the image box
    check(*encode(client, video=files["cmyk.jpg"]), "error", "not a video file")  # a picture in the video box
    long_prompt = "is there a red circle? " * 500
    check(*encode(client, image=EXAMPLE["path"], prompt=long_prompt), "error", "at most 2,000")
    check(*encode(client, image=EXAMPLE["path"], prompt="is\x00 there a\x07 red\x1b circle?"), "ok",
          "3 control characters removed")
    check(*encode(client, image=EXAMPLE["path"], prompt="\x00\x01\x02"), "error", "prompt is empty")
    ok, status = encode(client, image=EXAMPLE["path"], prompt="有红色圆圈吗？😀")  # still answers, with a warning
    check(ok, status, "ok", "**Warning:** 2 pieces of the prompt are unknown to shapes-llava")
    assert "`<unk>`" in status and "`有红色圆圈吗`" in status and "Words shapes-llava knows:" in status

    raw = Raw(app_url, client.session_hash)
    for text, must in (("m=mi,nosuch", "nosuch"), ("m=mi&zz=3", "'zz' is unknown"), ("b=lots", "cannot read")):
        check(*raw.call("settings", [text]), "error", must)
    at = control_names().index
    for name, value, must in (("methods", ["mi", "nosuch"], "nosuch"), ("text_mode", "bogus", "bogus")):
        vals = list(CTL)
        vals[at(name)] = value
        check(*raw.call("view", vals), "error", must)
    for bad in (float("nan"), float("inf")):
        for name in NUMERIC:  # every numeric control, in /view
            vals = list(CTL)
            vals[at(name)] = bad
            ok, msg = raw.call("view", vals)
            check(ok, msg, "error", "")
            assert any(s in msg for s in (name, "finite", "greater than maximum")), (name, msg)
        check(*raw.call("generate", [*CTL, bad]), "error", "")  # max_new_tokens
        check(*raw.call("inspect", [*CTL, bad, 10.0]), "error", "x must be a finite number")
        check(*raw.call("inspect", [*CTL, 10.0, bad]), "error", "y must be a finite number")
    assert seen >= 25 + 2 * len(NUMERIC)

    # the server still answers, in this session and in a new one
    for c in (client, type(client)(app_url, verbose=False)):
        ok, status = encode(c, image=EXAMPLE["path"])
        assert ok and "196 visual tokens" in status and "Warning" not in status
        out = c.predict(*CTL, api_name="/view")[-2]
        assert [m["kept"] for m in out["methods"]] == [16, 16]
