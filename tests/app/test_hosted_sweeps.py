"""The app started as a Space (SPACE_ID set, hub unreachable, the system temp folder a test folder), through
gradio_client as an anonymous visitor would: zips that would fill the disk leave nothing behind, a sweep is
bounded per call, a visitor runs one sweep at a time and sees their place, and views answer meanwhile."""
from __future__ import annotations

import json
import os
import time
import zipfile

import pytest

from components.core.examples import load_examples
from components.core.settings import Settings
from components.page.controls import control_values

from .test_space import start_space
from .test_sweep_queue import zeros_zip

IMAGE = next(e for e in load_examples() if e["kind"] == "image")


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("space-tmp")
    proc, url, log = start_space(tmp_path_factory, TMPDIR=str(tmp), MIPRUNER_MODEL="shapes-llava")
    yield url, tmp, log
    proc.terminate()
    proc.wait(30)


def client_of(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def submit_sweep(client, methods=("mi",), values="4", n=2, zip_file=None, qset="pope"):
    from gradio_client import handle_file

    z = handle_file(zip_file) if zip_file else None
    return client.submit(list(methods), "budget", values, 16, qset if not zip_file else "my own (zip)", n, 1234, z,
                         None, "value", ["acc"], "shapes-llava", "", *control_values(Settings(), 196),
                         api_name="/sweep")


def bytes_under(folder) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def test_zips_that_would_fill_the_disk_leave_nothing(hosted, tmp_path):
    from gradio_client.exceptions import AppError

    url, tmp, _ = hosted
    client = client_of(url)
    bomb = zeros_zip(tmp_path / "bomb.zip", 300)  # ~300 KB: 300 MiB of zeros named big.png
    assert os.path.getsize(bomb) < 1 << 20
    for _ in range(3):
        with pytest.raises(AppError, match=r"zip: its media unpack to 300 MiB; this server unpacks at most 200 MiB"):
            submit_sweep(client, zip_file=bomb).result(timeout=120)
    # under the hosted cap: unpacked, refused by the model's reader, and removed
    small = zeros_zip(tmp_path / "small.zip", 20)
    with pytest.raises(AppError, match="big.png"):
        submit_sweep(client, zip_file=small).result(timeout=120)
    # a good zip: swept, and its folder removed too
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.write(IMAGE["path"], "scene.png")
        zf.writestr("questions.jsonl", json.dumps({"media": "scene.png", "question": IMAGE["prompt"], "answer": "yes"}))
    status, *_ = submit_sweep(client, zip_file=str(good), n=1).result(timeout=300)
    assert "Sweep done" in status
    assert [n for n in os.listdir(tmp) if n.startswith("mipruner-set-")] == []
    # what is left: the uploads and the good sweep's downloads (Gradio's folder, under --files-mb), not MiBs
    assert bytes_under(tmp) < 8 << 20, sorted(os.listdir(tmp))


def test_a_sweep_above_the_hosted_bound_is_refused_with_a_sentence(hosted):
    from gradio_client.exceptions import AppError

    client = client_of(hosted[0])
    with pytest.raises(AppError, match=r"^Items must be in \[1, 100\] on this server, got 101$"):
        submit_sweep(client, n=101).result(timeout=60)
    with pytest.raises(AppError, match=r"model steps .* at most 2,000 per call: use fewer items, methods or values"):
        submit_sweep(client, ("mi", "random", "similarity"), "2,4,8,16,32,64", n=100).result(timeout=60)


def wait_for(job, text: str, timeout: float = 240):
    """The job's first status line containing `text` (its outputs are read while it runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for out in job.outputs():
            if text in str(out[0]):
                return out[0]
        if job.done():
            break
        time.sleep(0.2)
    raise AssertionError(f"no status with {text!r}: {[o[0] for o in job.outputs()]} {job.status()}")


def test_one_sweep_per_visitor_a_place_in_line_and_views_meanwhile(hosted):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url = hosted[0]
    first, second, viewer = client_of(url), client_of(url), client_of(url)
    running = submit_sweep(first, ("mi", "similarity"), "4,8", n=40)
    wait_for(running, "Sweeping: 1 / 40")
    with pytest.raises(AppError, match="each visitor runs one sweep at a time"):
        submit_sweep(first).result(timeout=60)
    waiting = submit_sweep(second, n=1)
    assert "1 sweep before yours" in wait_for(waiting, "Waiting for the sweep queue")
    # another visitor's view answers while the sweep runs (it does not queue behind it)
    viewer.predict("shapes-llava", "", "image", handle_file(IMAGE["path"]), None, IMAGE["prompt"],
                   *control_values(Settings(), 196), api_name="/encode")
    view = viewer.predict(*control_values(Settings(methods=("mi",), budget=16), 196), api_name="/view")
    assert "MI-Pruner" in str(view) and not running.done()
    status = waiting.result(timeout=400)[0]
    # the queue served the first visitor's sweep before it (its result, not the client's polling flag)
    assert "Sweep done" in status and "Sweep done" in running.result(timeout=60)[0]
