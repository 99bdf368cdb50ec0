"""Question sets for sweeps: the embedded model's generated sets, or the user's own zip + JSONL.

Generated (`mipruner.shapes.scenes`, any seed; 1234 is held out from training):
  pope                  presence questions, the three POPE splits (random, popular, adversarial)
  pope-random / pope-popular / pope-adversarial   one split
  open                  colour and count questions ("what color is the star?", "how many ...")
  clips                 colour and count questions about 8-frame clips
Every generated item carries the asked object's masks, so query recall is measured.

The user's own: a zip of images and/or videos plus a JSON-lines file of questions (inside the zip
as `questions.jsonl`, or given separately). One object per line:

    {"media": "photos/001.jpg", "question": "Is there a dog?", "answer": "yes"}
    {"media": "clips/a.mp4", "question": "What color is the car?", "answer": "red", "split": "cars"}

`media` is a path inside the zip; `answer` is the gold answer (yes/no questions are scored as
POPE: accuracy, F1, yes-rate; others by the first word, numbers as digits); optional `id`,
`split` (a group the sweep also reports separately) and `kind` ("yesno" or "open"; default:
yesno when the answer is yes or no).
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import tempfile
import zipfile

from mipruner.media import is_video_path

from .tasks import EvalItem

GENERATED = ("pope", "pope-random", "pope-popular", "pope-adversarial", "open", "clips")
POPE_SPLITS = ("random", "popular", "adversarial")
MAX_ZIP_BYTES = 2 << 30  # uncompressed size of a user's zip (2 GiB)
MAX_ZIP_FILES = 20_000
MAX_ITEMS = 100_000
QUESTIONS_NAME = "questions.jsonl"


def generated_set(name: str, n: int = 60, seed: int = 1234) -> list[EvalItem]:
    """`n` items of generated set `name` (see the module docstring); "pope": n spread over the splits."""
    from .shapes import shapes_items

    if name not in GENERATED:
        raise ValueError(f"unknown question set {name!r}; choose one of {', '.join(GENERATED)} or give a zip")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the set size must be an int >= 1, got {n!r}")
    if name == "open":
        return shapes_items("shapes-open", n=n, seed=seed)[:n]
    if name == "clips":
        return shapes_items("shapes-video", n=n, seed=seed)[:n]
    splits = POPE_SPLITS if name == "pope" else (name.split("-", 1)[1],)
    sizes = [n // len(splits) + (i < n % len(splits)) for i in range(len(splits))]
    items = shapes_items("shapes-pope", n=max(sizes), seed=seed)
    out = []
    for split, size in zip(splits, sizes):
        out += _alternate([it for it in items if it.split == split])[:size]
    return out


def _alternate(items: list[EvalItem]) -> list[EvalItem]:
    """yes, no, yes, no, ... (each in its original order), so any prefix stays balanced: the
    scenes list a scene's positives before its negatives."""
    yes = [it for it in items if it.answer == "yes"]
    no = [it for it in items if it.answer != "yes"]
    out = [it for pair in zip(yes, no) for it in pair]
    return out + yes[len(no):] + no[len(yes):]


def _safe_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    infos = [i for i in zf.infolist() if not i.is_dir()]
    if len(infos) > MAX_ZIP_FILES:
        raise ValueError(f"the zip holds {len(infos)} files; at most {MAX_ZIP_FILES}")
    if sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
        raise ValueError(f"the zip unpacks to more than {MAX_ZIP_BYTES >> 20} MiB")
    for i in infos:
        parts = i.filename.replace("\\", "/").split("/")
        if i.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise ValueError(f"the zip holds an unsafe path {i.filename!r}")
    return infos


def _member(media: str) -> str:
    """A JSONL `media` entry as a zip member name ("./a/b.png" -> "a/b.png"); escapes raise."""
    p = posixpath.normpath(media.replace("\\", "/"))
    if p.startswith(("/", "../")) or p == "..":
        raise ValueError(f"media {media!r} points outside the zip")
    return p


def _read_rows(text: str, where: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} line {n} is not JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where} line {n}: expected an object, got {type(row).__name__}")
        missing = [k for k in ("media", "question", "answer") if not str(row.get(k, "")).strip()]
        if missing:
            raise ValueError(f"{where} line {n} lacks {missing} (each line: media, question, answer)")
        rows.append(row)
        if len(rows) > MAX_ITEMS:
            raise ValueError(f"{where} has more than {MAX_ITEMS} questions")
    if not rows:
        raise ValueError(f"{where} holds no questions")
    return rows


def user_set(zip_path: str, questions: str | None = None, out_dir: str | None = None,
             n: int | None = None) -> list[EvalItem]:
    """Items from a zip of media and a JSONL of questions (see the module docstring).

    questions: a JSONL path; None reads `questions.jsonl` (or the only *.jsonl) inside the zip.
    out_dir: where the zip is unpacked (default: a new temporary folder). n: the first n items.
    """
    if not zipfile.is_zipfile(zip_path):
        raise ValueError(f"{os.path.basename(zip_path)!r} is not a zip file")
    out_dir = out_dir or tempfile.mkdtemp(prefix="mipruner-set-")
    with zipfile.ZipFile(zip_path) as zf:
        infos = _safe_members(zf)
        names = {i.filename for i in infos}
        if questions is None:
            jsonl = [nm for nm in names if nm.lower().endswith(".jsonl")]
            pick = [nm for nm in jsonl if os.path.basename(nm) == QUESTIONS_NAME] or jsonl
            if len(pick) != 1:
                raise ValueError(f"put one {QUESTIONS_NAME} in the zip (found {sorted(jsonl) or 'none'}), "
                                 "or give the questions file separately")
            text, where = zf.read(pick[0]).decode("utf-8"), pick[0]
        else:
            with open(questions, encoding="utf-8") as f:
                text, where = f.read(), os.path.basename(questions)
        rows = _read_rows(text, where)[: n or None]
        for r in rows:
            r["media"] = _member(str(r["media"]))
            if r["media"] not in names:
                raise ValueError(f"{where}: media {r['media']!r} is not in the zip")
        zf.extractall(out_dir, members=infos)
    items = []
    for i, r in enumerate(rows):
        answer = str(r["answer"]).strip()
        kind = r.get("kind") or ("yesno" if answer.lower() in ("yes", "no") else "open")
        if kind not in ("yesno", "open"):
            raise ValueError(f"{where}: kind must be yesno or open, got {kind!r}")
        path = os.path.join(out_dir, *r["media"].split("/"))
        items.append(EvalItem(id=str(r.get("id", i)), media=path, question=str(r["question"]), answer=answer.lower()
                              if kind == "yesno" else answer, kind=kind, split=str(r.get("split") or "all")))
    return items


def describe(items: list[EvalItem]) -> dict:
    """Counts for a set: items, yes/no and open questions, videos, splits."""
    videos = sum(1 for it in items if hasattr(it.media, "frames") or (isinstance(it.media, str)
                                                                       and is_video_path(it.media)))
    return {"items": len(items), "yesno": sum(it.kind == "yesno" for it in items),
            "open": sum(it.kind == "open" for it in items), "videos": videos,
            "with_masks": sum(it.masks is not None for it in items),
            "splits": sorted({it.split for it in items}), "yes_share": _yes_share(items)}


def _yes_share(items: list[EvalItem]) -> float:
    yn = [it for it in items if it.kind == "yesno"]
    return sum(it.answer == "yes" for it in yn) / len(yn) if yn else math.nan


__all__ = ["GENERATED", "QUESTIONS_NAME", "describe", "generated_set", "user_set"]
