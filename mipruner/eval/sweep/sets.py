"""Question sets for sweeps: the embedded model's generated sets, or the user's own zip + JSONL.

Generated (`mipruner.shapes.scenes`, any seed; 1234 is held out from training):
  pope                  presence questions, the three POPE splits (random, popular, adversarial)
  pope-random / pope-popular / pope-adversarial   one split
  open                  colour and count questions ("what color is the star?", "how many ...")
  clips                 colour and count questions about 8-frame clips
  events                8-frame clips whose answers are in some frames only (an object appears late)
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

import contextlib
import json
import math
import os
import posixpath
import shutil
import tempfile
import zipfile

from mipruner.media import is_video_path

from ..tasks import EvalItem

GENERATED = ("pope", "pope-random", "pope-popular", "pope-adversarial", "open", "clips", "events")
POPE_SPLITS = ("random", "popular", "adversarial")
MAX_ZIP_BYTES = 2 << 30  # uncompressed size of a user's zip (2 GiB)
MAX_ZIP_FILES = 20_000
MAX_ITEMS = 100_000
MAX_QUESTIONS_BYTES = 64 << 20  # a questions.jsonl
QUESTIONS_NAME = "questions.jsonl"


def generated_set(name: str, n: int = 60, seed: int = 1234) -> list[EvalItem]:
    """`n` items of generated set `name` (see the module docstring); "pope": n spread over the splits."""
    from ..shapes import shapes_items

    if name not in GENERATED:
        raise ValueError(f"unknown question set {name!r}; choose one of {', '.join(GENERATED)} or give a zip")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the set size must be an int >= 1, got {n!r}")
    if name == "open":
        return shapes_items("shapes-open", n=n, seed=seed)[:n]
    if name == "clips":
        return shapes_items("shapes-video", n=n, seed=seed)[:n]
    if name == "events":
        return shapes_items("shapes-events", n=n, seed=seed)[:n]
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
    for i in infos:
        parts = i.filename.replace("\\", "/").split("/")
        if i.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise ValueError(f"the zip holds an unsafe path {i.filename[:80]!r}")
    return infos


def _member(media: str) -> str:
    """A JSONL `media` entry as a zip member name ("./a/b.png" -> "a/b.png"); escapes raise."""
    p = posixpath.normpath(media.replace("\\", "/"))
    if p.startswith(("/", "../")) or p == "..":
        raise ValueError(f"media {media[:80]!r} points outside the zip")
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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


def user_set(zip_path: str, questions: str | None = None, out_dir: str | None = None,
             n: int | None = None, *, max_bytes: int = MAX_ZIP_BYTES) -> list[EvalItem]:
    """Items from a zip of media and a JSONL of questions (see the module docstring).

    questions: a JSONL path; None reads `questions.jsonl` (or the only *.jsonl) inside the zip.
    out_dir: where the media are unpacked (default: a new temporary folder, removed again when this
    fails; `unpacked_set` also removes it afterwards). n: the first n items. Only the media the
    questions name are unpacked; max_bytes caps their size (read from the zip before unpacking).
    """
    if not zipfile.is_zipfile(zip_path):
        raise ValueError(f"{os.path.basename(zip_path)[:60]!r} is not a zip file")
    made = out_dir is None
    out_dir = out_dir or tempfile.mkdtemp(prefix="mipruner-set-")
    try:
        return _unpack(zip_path, questions, out_dir, n, max_bytes)
    except BaseException:
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def unpacked_set(zip_path: str, questions: str | None = None, *, n: int | None = None,
                 max_bytes: int = MAX_ZIP_BYTES, parent: str | None = None):
    """`user_set` unpacked into a new `mipruner-set-*` folder (under `parent`, default the system's temporary
    folder) that is removed when the block ends, whether the sweep finished, failed or was cancelled."""
    folder = tempfile.mkdtemp(prefix="mipruner-set-", dir=parent)
    try:
        yield user_set(zip_path, questions, folder, n, max_bytes=max_bytes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def media_bytes(zip_path: str, questions: str | None = None, n: int | None = None) -> int:
    """What the first `n` questions' media unpack to (bytes, from the zip's directory; nothing unpacked)."""
    with zipfile.ZipFile(zip_path) as zf:
        _, rows, infos = _rows(zf, questions, n)
    return sum(infos[r["media"]].file_size for r in rows if r["media"] in infos)


def media_kind(media) -> str:
    """"video" for a video (a `Video`, a video file's name, a list of frames), else "image": the kinds a
    sweep's time per model step is measured by (a clip's step costs its frames' tokens)."""
    if hasattr(media, "frames") or (isinstance(media, (list, tuple)) and len(media) > 1):
        return "video"
    return "video" if isinstance(media, (str, os.PathLike)) and is_video_path(os.fspath(media)) else "image"


def zip_kinds(zip_path: str, questions: str | None = None, n: int | None = None) -> list[str]:
    """`media_kind` of each of the first `n` questions' media (from the zip's directory; nothing unpacked)."""
    with zipfile.ZipFile(zip_path) as zf:
        _, rows, _ = _rows(zf, questions, n)
    return [media_kind(r["media"]) for r in rows]


def _rows(zf: zipfile.ZipFile, questions: str | None, n: int | None) -> tuple[str, list[dict], dict]:
    """(where the questions were read, the first n rows with their media as member names, name -> ZipInfo)."""
    infos = {i.filename: i for i in _safe_members(zf)}
    if questions is None:
        jsonl = [nm for nm in infos if nm.lower().endswith(".jsonl")]
        pick = [nm for nm in jsonl if os.path.basename(nm) == QUESTIONS_NAME] or jsonl
        if len(pick) != 1:
            raise ValueError(f"put one {QUESTIONS_NAME} in the zip (found {sorted(jsonl)[:5] or 'none'}), "
                             "or give the questions file separately")
        if infos[pick[0]].file_size > MAX_QUESTIONS_BYTES:
            raise ValueError(f"{pick[0][:60]} is larger than {_mib(MAX_QUESTIONS_BYTES)}")
        text, where = zf.read(pick[0]).decode("utf-8"), pick[0][:60]
    else:
        with open(questions, encoding="utf-8") as f:
            text, where = f.read(MAX_QUESTIONS_BYTES + 1), os.path.basename(questions)[:60]
        if len(text) > MAX_QUESTIONS_BYTES:
            raise ValueError(f"{where} is larger than {_mib(MAX_QUESTIONS_BYTES)}")
    rows = _read_rows(text, where)[: n or None]
    for r in rows:
        r["media"] = _member(str(r["media"]))
    return where, rows, infos


def _unpack(zip_path: str, questions: str | None, out_dir: str, n: int | None, max_bytes: int) -> list[EvalItem]:
    with zipfile.ZipFile(zip_path) as zf:
        where, rows, infos = _rows(zf, questions, n)
        for r in rows:
            if r["media"] not in infos:
                raise ValueError(f"{where}: media {r['media'][:80]!r} is not in the zip")
        needed = [infos[m] for m in dict.fromkeys(r["media"] for r in rows)]
        size = sum(i.file_size for i in needed)
        if size > max_bytes:
            raise ValueError(f"the zip's media unpack to {_mib(size)}; at most {_mib(max_bytes)} are unpacked "
                             "(use fewer or smaller files)")
        zf.extractall(out_dir, members=needed)
    items = []
    for i, r in enumerate(rows):
        answer = str(r["answer"]).strip()
        kind = r.get("kind") or ("yesno" if answer.lower() in ("yes", "no") else "open")
        if kind not in ("yesno", "open"):
            raise ValueError(f"{where}: kind must be yesno or open, got {str(kind)[:40]!r}")
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


__all__ = ["GENERATED", "MAX_ZIP_BYTES", "QUESTIONS_NAME", "describe", "generated_set", "media_bytes", "media_kind",
           "unpacked_set", "user_set", "zip_kinds"]
