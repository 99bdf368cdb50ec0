"""Per-sample answer cache: a resumed run redoes only the samples it had not answered yet.

lmms-eval's own response cache (`--use_cache`, 0.7.3) stores a request type's answers only after
the model has returned all of them, and a run that dies writes nothing to its shared database; so
an interrupted run starts over. This cache writes each answer as soon as it exists: one JSON line
per answer, appended and fsync'ed, in one file per rank (`answers.rank<R>.jsonl`, no two processes
write one file). Opening the cache reads every rank's file, so a run resumed with another number
of processes (or nodes sharing the folder) still finds every finished sample. A line cut short by
a kill is skipped.

The key of an answer covers everything that decides it: the model (path or hub id, dtype, device
type), the method configuration (`MethodConfig.key`), the task, split and document id, the
prompt, the media's content hash (`mipruner.media.media_hash`, which keys the app's encodings too)
and the generation length; change any of them and the sample is answered anew.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os


def answer_key(model_key: str, task: str, split: str, doc_id, prompt: str, media: str, max_new_tokens: int) -> str:
    """One answer's key: a hash of everything that can change it (the model and method settings in
    `model_key`, the task, the document, the prompt, the media's content, the answer length)."""
    payload = json.dumps([model_key, task, split, str(doc_id), prompt, media, int(max_new_tokens)])
    return hashlib.sha256(payload.encode()).hexdigest()


class AnswerCache:
    """Answers by key, read from every rank's file in `folder`; `put` appends to this rank's file."""

    def __init__(self, folder: str, rank: int = 0):
        self.folder = os.path.abspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.path = os.path.join(self.folder, f"answers.rank{int(rank)}.jsonl")
        self.answers: dict[str, str] = {}
        for p in sorted(glob.glob(os.path.join(self.folder, "answers.rank*.jsonl"))):
            with open(p, encoding="utf-8") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                        self.answers[rec["key"]] = rec["answer"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue  # a line cut short by a kill
        self.loaded = len(self.answers)
        self.hits = 0
        self._file = None

    def get(self, key: str) -> str | None:
        out = self.answers.get(key)
        if out is not None:
            self.hits += 1
        return out

    def has(self, key: str) -> bool:
        return key in self.answers

    def put(self, key: str, answer: str, **info) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
            # a line cut short by a kill has no newline: start on a fresh line
            if self._file.tell() > 0:
                with open(self.path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        self._file.write("\n")
        self._file.write(json.dumps({"key": key, "answer": answer, **info}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.answers[key] = answer

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
