"""A queued sweep's zip is unpacked when the sweep starts, not while it waits (issue 55, item 12): while
another visitor's sweep runs, the waiting one holds no folder and no bytes of the files cap; it unpacks
once its turn comes and removes the folder when it ends. The pace it measures is its items' kind's."""
from __future__ import annotations

import json
import os
import tempfile
import zipfile

import numpy as np
from PIL import Image

from components.core import sweep_logic as SL
from components.core.sweep_queue import Pace, SweepQueue
from mipruner.serve.session import FileBudget


def image_zip(path, n: int = 2) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        rows = []
        for i in range(n):
            name = f"img{i}.png"
            with zf.open(name, "w") as f:
                Image.fromarray(np.full((48, 48, 3), 60 * i, np.uint8)).save(f, format="PNG")
            rows.append(json.dumps({"media": name, "question": "Is there a circle?", "answer": "no"}))
        zf.writestr("questions.jsonl", "\n".join(rows))
    return str(path)


def sets_in(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith("mipruner-set-")]


def test_a_waiting_sweep_holds_no_unpacked_folder(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = hub.get("shapes-llava")[0]
    files = FileBudget([tmp_path / "uploads"], 64 << 20)
    z = image_zip(tmp_path / "set.zip")
    queue, pace = SweepQueue(slots=1, max_waiting=4), Pace()
    queue.join("other")  # another visitor's sweep is running
    assert list(queue.wait("other")) == []
    sw = SL.make_sweep(["random"], "budget", "4", 16, {}, "question", 2)
    with SL.question_set(SL.SETS[-1], 2, 0, z, files=files) as (items, name):
        gen = SL.run(SL.SweepState(), engine, sw, items, name, "waiting-visitor", pace=pace, queue=queue)
        assert next(gen) == ("waiting", 1)
        assert sets_in(tmp_path) == [] and files.held == 0  # waiting: nothing unpacked, nothing held
        queue.leave("other")
        assert next(gen) == ("progress", 1, 2)
        assert len(sets_in(tmp_path)) == 1 and files.held > 0  # its turn: unpacked
        events = list(gen)
    assert events[-1][0] == "done" and events[-1][1].n_items == 2
    assert sets_in(tmp_path) == [] and files.held == 0
    assert pace.per_step(engine.model_name, "image") is not None and pace.per_step(engine.model_name, "video") is None
