"""The examples gallery: generated scenes and one clip under assets/examples (ours to redistribute).

    python -m components.core.examples        # (re)writes assets/examples/ deterministically

Scenes come from `mipruner.shapes.scenes` with a seed the embedded model never trained on; each example's
prompt asks about an object that is really in the picture (checked when writing). Images are
upscaled 3x with nearest-neighbour so they show crisply; the processor resizes them back.
The clip is H.264 in MP4 (browsers play it; MPEG-4 Part 2 they do not), with a poster image (four
of its frames) that the examples table shows as its thumbnail.
"""
from __future__ import annotations

import json
import os

from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(ROOT, "assets", "examples")
SEED = 424_242  # never used by mipruner.shapes.train (training draws from seed 0)
SCALE = 3
VIDEO_CODEC = "libx264"  # H.264: what every browser decodes in MP4 (PyAV's wheels include libx264)


FAMILY_ORDER = ("color", "count", "presence", "color")  # one question family per example, in turn


def _question(scene, family: str) -> str:
    """A question of `family` about an object really in the scene (colour: of a unique shape)."""
    from mipruner.shapes import questions as sq

    objs = scene.objects
    shapes = [o.shape for o in objs]
    unique = [o for o in objs if shapes.count(o.shape) == 1]
    if family == "color" and unique:
        return sq.color_question(unique[0].shape)
    if family == "count":
        return sq.count_question(objs[0].shape)
    return sq.presence_question(objs[-1].color, objs[-1].shape)


def write_examples(out_dir: str = EXAMPLES_DIR, n_images: int = 4) -> list[dict]:
    """Write n_images scenes (PNG), one 8-frame clip (H.264 MP4) and its poster (PNG) with prompts;
    returns the index."""
    from mipruner.media import write_video
    from mipruner.shapes import scenes as sc

    os.makedirs(out_dir, exist_ok=True)
    rows, index = [], 0
    while len(rows) < n_images:
        scene = sc.make_scene(SEED, index)
        index += 1
        if len(scene.objects) < 2:  # pruning is more telling with a few objects
            continue
        name = f"scene_{len(rows)}.png"
        img = scene.pil()[0]
        img.resize((img.width * SCALE, img.height * SCALE), Image.NEAREST).save(os.path.join(out_dir, name))
        q = _question(scene, FAMILY_ORDER[len(rows) % len(FAMILY_ORDER)])
        rows.append({"file": name, "kind": "image", "prompt": q,
                     "objects": [o.category for o in scene.objects]})
    clip = sc.make_clip(SEED, 0, n_objects=2)
    frames = [f.resize((f.width * 2, f.height * 2), Image.NEAREST) for f in clip.pil()]
    write_video(frames, os.path.join(out_dir, "clip_0.mp4"), fps=4, codec=VIDEO_CODEC)
    poster(frames).save(os.path.join(out_dir, "clip_0.png"))
    rows.append({"file": "clip_0.mp4", "kind": "video", "prompt": _question(clip, "color"),
                 "objects": [o.category for o in clip.objects], "thumb": "clip_0.png"})
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump({"seed": SEED, "examples": rows}, f, indent=1)
    return rows


def poster(frames: list[Image.Image], n: int = 4) -> Image.Image:
    """`n` evenly spaced frames side by side, 2 px apart: a clip's thumbnail."""
    pick = [frames[round(i * (len(frames) - 1) / max(1, n - 1))] for i in range(min(n, len(frames)))]
    w, h = pick[0].size
    out = Image.new("RGB", (len(pick) * (w + 2) - 2, h), "white")
    for i, f in enumerate(pick):
        out.paste(f.convert("RGB"), (i * (w + 2), 0))
    return out


def load_examples(out_dir: str = EXAMPLES_DIR) -> list[dict]:
    """The shipped examples with absolute paths ("path", and "thumb": the picture the examples table
    shows, a video's poster); [] when the folder is missing."""
    path = os.path.join(out_dir, "index.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)["examples"]
    out = []
    for r in rows:
        path = os.path.join(out_dir, r["file"])
        thumb = os.path.join(out_dir, r["thumb"]) if r.get("thumb") else path if r["kind"] == "image" else None
        if os.path.exists(path):
            out.append({**r, "path": path, "thumb": thumb if thumb and os.path.exists(thumb) else None})
    return out


if __name__ == "__main__":
    for r in write_examples():
        print(r["kind"], r["file"], "|", r["prompt"], "|", ", ".join(r["objects"]))
