"""The slider's fast path (components.core.panel_files): outputs prepared as Gradio's postprocess would
make them, each image written once per image object, entries freed with their images."""
from __future__ import annotations

import gc
import os

import gradio as gr
import numpy as np
from PIL import Image

from components.core.panel_files import PanelImages, prepared
from mipruner import viz


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 56, 3), dtype=np.uint8))


def test_prepared_matches_gradios_postprocess(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    md, img, num, txt, st = (gr.Markdown(), gr.Image(type="pil", format="jpeg"), gr.Number(precision=0),
                             gr.Textbox(), gr.State())
    pic = picture(0)
    state_value = {"props": [1, 2]}
    got = prepared([md, img, num, txt, st, md, img],
                   ["  **a**\n  b", pic, 3.7, "x", state_value, None, gr.update(visible=False)],
                   PanelImages())
    assert got[0] == md.postprocess("  **a**\n  b")
    want = img.postprocess(pic).model_dump()
    path, gradios = got[1].pop("path"), want.pop("path")
    assert got[1] == want and os.path.dirname(os.path.dirname(path)) == str(tmp_path)  # in the block's cache
    assert open(path, "rb").read() == open(gradios, "rb").read()  # the bytes Gradio writes
    want["path"] = path
    assert got[2] == num.postprocess(3.7) == 4
    assert got[3] == "x" and got[4] is state_value and got[5] is None
    assert got[6] == {"__type__": "update", "visible": False}
    up = prepared([img], [gr.update(visible=True, value=pic, label="L")], PanelImages())[0]
    assert up["visible"] is True and up["label"] == "L" and up["value"] == want


def test_an_image_is_written_once_and_again_when_its_file_went(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    block, images = gr.Image(type="pil", format="jpeg"), PanelImages()
    pic = picture(1)
    first = images.file(pic, block)
    written = os.stat(first["path"]).st_mtime_ns
    again = images.file(pic, block)
    assert again == first and os.stat(again["path"]).st_mtime_ns == written
    again["url"] = "changed by the caller"
    assert "url" not in images.file(pic, block) or images.file(pic, block)["url"] != "changed by the caller"
    os.remove(first["path"])  # e.g. the app's FileBudget pruned it
    remade = images.file(pic, block)
    assert os.path.exists(remade["path"])
    other = images.file(picture(2), block)
    assert other["path"] != remade["path"]


def test_a_file_there_already_is_never_written_again(tmp_path, monkeypatch):
    """Gradio's writer truncates and rewrites its file at every post-process, which a browser reading it at that
    moment sees short; here an equal picture (another object, another memo: two draws of one view at once, or
    two sessions of one example) finds the file whole and leaves it alone, and a file is only ever renamed in."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    block = gr.Image(type="pil", format="png")
    first = PanelImages().file(picture(3), block)
    assert Image.open(first["path"]).tobytes() == picture(3).tobytes()
    size = os.path.getsize(first["path"])
    with open(first["path"], "r+b") as f:  # a mark of the same length: any write of the file would undo it
        f.write(b"m" * size)
    again = PanelImages().file(picture(3), block)
    assert again == first and open(again["path"], "rb").read() == b"m" * size  # not written again
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["image.png"]  # no temporary left


def test_colorbar_composites_are_memoised_per_image_and_label():
    images = PanelImages()
    heat = viz.scores_heatmap(_Enc(), np.arange(6, dtype=np.float32))
    a = images.with_colorbar(heat, "cosine")
    assert images.with_colorbar(heat, "cosine") is a
    assert images.with_colorbar(heat, "PMI (nats)") is not a
    assert np.array_equal(np.asarray(a), np.asarray(viz.with_colorbar(heat, "cosine")))


def test_entries_go_with_their_images_and_the_memo_is_bounded():
    images = PanelImages(max_items=3)
    kept = [picture(i) for i in range(2)]
    for p in kept:
        images.with_colorbar(_heat(p), "x")  # the heatmap dies right after: its entry goes too
    gc.collect()
    assert len(images) == 0
    heats = [_heat(p) for p in (picture(5), picture(6), picture(7), picture(8))]
    for h in heats:
        images.with_colorbar(h, "x")
    assert len(images) == 3  # least recently used first
    del heats, h
    gc.collect()
    assert len(images) == 0


def _heat(pic: Image.Image) -> Image.Image:
    out = pic.copy()
    out.info.update(vmin=0.0, vmax=1.0, cmap="viridis")
    return out


class _Enc:
    """A 2 x 3 grid of 8 px patches on a 24 x 16 image (what viz needs of an encoding)."""

    def __init__(self):
        import torch

        from mipruner.models.base import TokenGeometry

        f, r, c = torch.zeros(6, dtype=torch.long), torch.arange(6) // 3, torch.arange(6) % 3
        box = torch.stack([c * 8, r * 8, (c + 1) * 8, (r + 1) * 8], dim=1).float()
        self.geometry = TokenGeometry(frame=f, row=r, col=c, box=box, kind=["patch"] * 6, grids=[(2, 3)],
                                      sizes=[(24, 16)])
        self.frames = [Image.new("RGB", (24, 16), "gray")]
        self.is_video = False
        self.n_visual = 6
