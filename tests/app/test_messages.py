"""Plain messages without a server: unreadable and oversized images, empty and corrupt videos, NaN
coordinates, prompts the model cannot read (a warning, and the app still answers), and handlers
whose unexpected failures reach the page as a sentence while the server log keeps the traceback."""
from __future__ import annotations

import logging
import os
import struct
import zlib
from types import SimpleNamespace

import pytest
from PIL import Image

from components.core.examples import load_examples
from components.core.logic import AppLogic, UserError, budget_of, probe_video
from components.core.messages import clean_prompt, input_problem, plain, unknown_words_warning
from components.core.settings import Settings
from mipruner.serve.prompt_words import PromptWords, prompt_words
from mipruner.media import MAX_IMAGE_PIXELS, MediaError, load_image, load_video

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")


@pytest.fixture(scope="module")
def logic(hub):
    return AppLogic(hub, max_new_tokens=4)


def _png_header(w: int, h: int) -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def test_unreadable_and_oversized_images_say_why_without_paths(tmp_path):
    (tmp_path / "notes.png").write_text("not a picture")
    (tmp_path / "huge.png").write_bytes(_png_header(30_000, 30_000))  # PIL's own bomb check refuses it
    (tmp_path / "big.png").write_bytes(_png_header(8_000, 8_000))  # under PIL's limit, over ours
    Image.new("RGB", (64, 64), "red").save(tmp_path / "ok.jpg", quality=95)
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "ok.jpg").read_bytes()[:300])
    for name, must in (("notes.png", "not a picture"), ("huge.png", "900 megapixels"),
                       ("big.png", f"at most {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels"),
                       ("cut.jpg", "incomplete or damaged")):
        with pytest.raises(MediaError) as e:
            load_image(tmp_path / name)
        assert str(e.value).startswith(f"cannot read image {name!r}:") and must in str(e.value)
        assert str(tmp_path) not in str(e.value)


def test_empty_and_corrupt_videos_without_paths_or_error_numbers(tmp_path):
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "corrupt.mp4").write_bytes(b"\x00garbage" * 300)
    for name, must in (("empty.mp4", "the file is empty (0 bytes)"),
                       ("corrupt.mp4", "not a video this app can decode")):
        for fn in (lambda p: probe_video(p), lambda p: load_video(p)):
            with pytest.raises((UserError, MediaError)) as e:
                fn(str(tmp_path / name))
            msg = str(e.value)
            assert must in msg and name in msg, msg
            assert "Errno" not in msg and str(tmp_path) not in msg and "/" not in msg.replace("MP4, WebM", "")


def test_plain_keeps_ids_and_urls_but_not_server_paths():
    raw = ("cannot read video 'empty.mp4': [Errno 1094995529] Invalid data found when processing input: "
           "'/tmp/gradio/9216dbd36b/empty.mp4'")
    assert plain(raw) == "cannot read video 'empty.mp4': Invalid data found when processing input: 'empty.mp4'"
    text = "see https://huggingface.co/llava-hf/x and llava-hf/llava-1.5-7b-hf"
    assert plain(text) == text
    assert plain("no file /srv/models/secret/config.json") == "no file config.json"


def test_non_finite_numbers_are_refused_plainly(logic):
    st, _ = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    for x, y in ((float("nan"), 3.0), (3.0, float("inf"))):
        with pytest.raises(UserError, match="finite numbers"):
            logic.inspect(st, Settings(methods=("mi",)), x, y)
    with pytest.raises(UserError, match="budget must be a finite number"):
        budget_of(float("nan"), "tokens", 196)
    with pytest.raises(UserError, match="max new tokens must be a finite number"):
        logic.generate(st, Settings(methods=("mi",), budget=8), float("inf"))
    assert input_problem("seed", "number", float("nan"), ValueError("x")) == "seed must be a finite number, got nan"


def test_unknown_prompt_pieces_are_named_and_the_app_still_answers(logic):
    st, status = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None,
                              "有红色圆圈吗？😀 is there a circle")
    assert "**Warning:** 2 pieces of the prompt are unknown to shapes-llava and read as `<unk>`" in status
    assert "`有红色圆圈吗`" in status and "`？😀`" in status
    words = status.split("Words shapes-llava knows:")[1]
    assert "circle" in words and "purple" in words and "<unk>" not in words
    out = logic.generate(st, Settings(methods=("mi",), budget=16), 4)  # answers are still given
    assert out["reference"]["visual_tokens"] == 196 and isinstance(out["methods"]["mi"]["text"], str)
    _, clean = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    assert "Warning" not in clean


def test_prompt_words_from_the_tokenizer():
    import mipruner

    tok = mipruner.load("shapes-llava", device="cpu").tokenizer
    got = prompt_words(tok, "is there a purple squre near the rhombus?")
    assert got.unknown == ["squre", "near", "rhombus"] and got.unk_token == "<unk>"
    assert "square" in got.known and "squre" not in got.known
    byte_level = SimpleNamespace(unk_token_id=None)  # byte-level BPE (Qwen): nothing is unknown
    assert prompt_words(byte_level, "有红色圆圈吗") == PromptWords([])
    # a large vocabulary: the pieces are named, the vocabulary is not listed
    msg = unknown_words_warning("big-model", PromptWords(["\u2603"], "<unk>", None))
    assert "1 piece of the prompt is unknown to big-model" in msg and "knows" not in msg


def test_prompt_limits_and_control_characters(logic):
    assert clean_prompt("a\x00b\x1bc\r\nd\te") == ("abc\nd\te", 2)
    with pytest.raises(UserError, match="at most 2,000"):
        logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, "x" * 10_000)
    with pytest.raises(UserError, match="prompt is empty"):
        logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, "\x00\x07")
    _, status = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, "is\x00 there a circle?")
    assert "1 control character removed" in status


def test_one_frame_video_status_says_frame(logic, tmp_path):
    from mipruner.media import write_video

    path = write_video([Image.new("RGB", (48, 48), "blue")], tmp_path / "one.mp4", fps=4)
    _, status = logic.encode(None, "shapes-llava", "video", None, path, "is there a circle?")
    assert "1 frame ->" in status


def test_handlers_turn_unexpected_errors_into_a_sentence(caplog):
    import gradio as gr

    from components.page.guards import plain_errors

    @plain_errors("drawing the panels")
    def broken(x):
        raise KeyError(f"internal detail {os.sep}srv{os.sep}x")

    @plain_errors("drawing the panels")
    def refused(x):
        raise UserError("choose at least one method")

    with caplog.at_level(logging.ERROR, logger="mipruner.app"):
        with pytest.raises(gr.Error) as e:
            broken(1)
    assert e.value.message.startswith("Something went wrong while drawing the panels.")
    assert "internal detail" not in e.value.message and "KeyError" in caplog.text  # the log keeps the details
    with pytest.raises(gr.Error) as e:
        refused(1)
    assert e.value.message == "choose at least one method"
