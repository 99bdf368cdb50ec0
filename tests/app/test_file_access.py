"""What a visitor can reach on the server's disk.

Read: a request never names a server file. Every event's every file input (found in the running app's
config, so a new endpoint is covered with no edit here) refuses a path outside Gradio's upload cache and
the app's assets, in every payload shape (Gradio's tagged FileData dict, an untagged dict, a bare string,
a list), with one sentence for an existing file and a missing one (no existence oracle): /etc/passwd, an
image written outside the cache, a `../` path out of the cache and symlinks from inside the cache to
outside. A file uploaded to the cache (and an asset) still encodes.

Write: uploads count under the files cap (--files-mb, 1 MiB here): a flood is refused with a sentence once
the cap is full, the folder stays under it, and the examples, served from the package, still load.

The app runs as `python app.py` with its own GRADIO_TEMP_DIR (the upload cache) in a temporary folder;
the flood runs last (it fills the cap).
"""
from __future__ import annotations

import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from components.core.examples import load_examples
from components.core.file_access import file_problem, not_uploaded, payload_paths, real_roots
from components.hosting.uploads import FULL

from .conftest import app_process, queue_call

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")
CAP = 1 << 20  # --files-mb 1
FILE_TYPES = {"image", "video", "file", "gallery", "audio", "model3d", "uploadbutton", "imageeditor",
              "multimodaltextbox", "imageslider"}


def shapes(path: str) -> dict:
    tagged = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "cat.png"}
    return {"tagged": tagged, "untagged": {"path": path}, "bare": path, "list": [tagged]}


# ------------------------------------------------------------------------------- without a server

def test_every_payload_shape_is_read_and_symlinks_are_resolved(tmp_path):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    (cache / "up").mkdir(parents=True)
    outside.mkdir()
    (cache / "up" / "ok.png").write_bytes(b"x")
    (outside / "secret.png").write_bytes(b"x")
    os.symlink(outside / "secret.png", cache / "up" / "link.png")
    roots = real_roots([cache])
    assert payload_paths({"video": {"path": "/a"}, "subtitles": None}) == [("path", "/a")]
    assert payload_paths([{"image": {"path": "/a"}, "caption": "a cat"}, "/b"]) == [("path", "/a"), ("path", "/b")]
    for shape, payload in shapes(str(cache / "up" / "ok.png")).items():
        assert file_problem("image", payload, roots) is None, shape
    bad = [str(outside / "secret.png"), str(cache / "up" / "link.png"), str(cache / ".." / "outside" / "secret.png"),
           str(outside / "missing.png"), str(cache / "up" / "missing.png"), "/etc/passwd", "/etc/no-such-file",
           str(cache), str(cache) + "-sibling/x.png", "cat.png"]
    for path in bad:
        for shape, payload in shapes(path).items():
            assert file_problem("image", payload, roots) == not_uploaded("image"), (path, shape)
    assert "web" in file_problem("image", {"path": "https://example.com/a.png"}, roots)
    assert "web" in file_problem("image", {"url": "data:image/png;base64,AAAA", "path": None}, roots)


def test_uploads_are_admitted_under_the_cap_and_kept_while_young(tmp_path):
    from mipruner.serve.files import FileBudget, FilesFull, disk_bytes

    (tmp_path / "probe").write_bytes(b"x")
    block = disk_bytes(os.stat(tmp_path / "probe"))  # what the disk holds for one small file (blocks, not bytes)
    os.remove(tmp_path / "probe")
    now = [1000.0]
    # interval_s=0: every admit walks the folder (the files written here by hand are not in the running count)
    fb = FileBudget([tmp_path], 10 * block, min_age_s=0, upload_age_s=60, interval_s=0, rescan_s=0,
                    clock=lambda: now[0])
    with fb.admit(6 * block):
        assert fb.held == 6 * block
        with pytest.raises(FilesFull):  # two uploads on their way: the second does not fit beside the first
            with fb.admit(5 * block):
                pass
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "photo.png").write_bytes(b"x" * (6 * block - 100))
    fb.uploaded([tmp_path / "up" / "photo.png"])
    on_disk = disk_bytes(os.stat(tmp_path / "up" / "photo.png")) + disk_bytes(os.stat(tmp_path / "up"))
    assert fb.held == 0 and fb.used() == on_disk == fb.total() >= 7 * block  # its folder counts too
    with pytest.raises(FilesFull):
        with fb.admit(10 * block - on_disk + 1):
            pass
    (tmp_path / "panel.png").write_bytes(b"x" * 4 * block)  # the app's own file: over the cap
    os.utime(tmp_path / "panel.png", (900, 900))
    os.utime(tmp_path / "up" / "photo.png", (800, 800))  # older than the panel, but a visitor's upload
    assert fb.prune() == 1 and (tmp_path / "up" / "photo.png").exists() and not (tmp_path / "panel.png").exists()
    (tmp_path / "panel.png").write_bytes(b"x" * 2 * block)  # within the cap now, but one upload fills it
    os.utime(tmp_path / "panel.png", (900, 900))
    with fb.admit(2 * block):  # the old panel makes room for the upload: the cap never locks itself shut
        assert not (tmp_path / "panel.png").exists() and (tmp_path / "up" / "photo.png").exists()
    with pytest.raises(FilesFull):  # a young upload is never pruned to make room for another
        with fb.admit(10 * block - on_disk + 1):
            pass
    assert (tmp_path / "up" / "photo.png").exists()
    (tmp_path / "panel.png").write_bytes(b"x" * 4 * block)
    os.utime(tmp_path / "panel.png", (900, 900))
    now[0] += 61  # the upload is no longer young: the oldest file goes first again
    assert fb.prune() == 1 and not (tmp_path / "up" / "photo.png").exists() and (tmp_path / "panel.png").exists()
    assert not (tmp_path / "up").exists() and fb.used() == fb.total()  # its folder went with it


# ------------------------------------------------------------------------------- through the running app

def _serve(base):
    cache = base / "cache"
    env = {**os.environ, "GRADIO_TEMP_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    env.pop("SPACE_ID", None)
    return app_process(["--model", "shapes-llava", "--compile", "off", "--files-mb", str(CAP >> 20)], env,
                       base / "app.log"), cache


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("access")
    launch, cache = _serve(base)
    with launch as client:
        yield client, cache, base


@pytest.fixture
def fresh(tmp_path):
    """A server of its own, whose cache holds no panel yet: what an upload may prune is then known (nothing),
    whatever the time the module's other tests took (their panels become prunable 30 s after they are drawn)."""
    launch, cache = _serve(tmp_path)
    with launch as client:
        yield client, cache, tmp_path


_HTTP = {}


def http():
    """One HTTP client for the module's calls (a new one per call costs more than the call)."""
    import httpx

    if "c" not in _HTTP:
        _HTTP["c"] = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=16))
    return _HTTP["c"]


def call(url: str, fn: int, data: list, queued: bool = True) -> tuple[bool, object]:
    """(success, output | error message) of event `fn` with `data`, as the page sends it."""
    session = uuid.uuid4().hex[:11]
    body = {"data": data, "fn_index": fn, "session_hash": session, "event_data": None, "trigger_id": None}
    if not queued:
        r = http().post(url + "gradio_api/run/predict", json=body)
        out = r.json()
        return r.status_code == 200 and "error" not in out, out.get("data", out.get("error"))
    return queue_call(http(), url, session, fn, data)


def file_inputs(url: str) -> list[tuple[int, dict, int, dict, dict]]:
    """(event index, event, input position, component, all components) of every file input of every event
    with a server function, from the app's config."""
    import httpx

    cfg = httpx.get(url + "config", timeout=30).json()
    comps = {c["id"]: c for c in cfg["components"]}
    out = []
    for i, dep in enumerate(cfg["dependencies"]):
        if not dep.get("backend_fn", True):
            continue
        for j, cid in enumerate(dep["inputs"]):
            if comps[cid]["type"] in FILE_TYPES:
                out.append((dep.get("id", i), dep, j, comps[cid], comps))
    return out


def defaults(dep: dict, comps: dict) -> list:
    return [None if comps[c]["type"] == "state" else comps[c].get("props", {}).get("value") for c in dep["inputs"]]


def test_every_file_input_of_every_event_refuses_server_files(served):
    client, cache, base = served
    url = client.src.rstrip("/") + "/"
    outside = base / "outside"
    outside.mkdir()
    shutil.copy(EXAMPLE["path"], outside / "secret.png")
    links = cache / "planted"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(outside / "secret.png", links / "secret.png")  # a link in the cache to a file outside
    os.symlink("/etc/passwd", links / "passwd")
    os.symlink(outside / "missing.png", links / "missing.png")  # its twin: to a missing file
    pairs = {  # an existing file -> a missing one in the same place
        "/etc/passwd": "/etc/no-such-file",
        str(outside / "secret.png"): str(outside / "missing.png"),
        f"{cache}/../outside/secret.png": f"{cache}/../outside/missing.png",
        str(links / "secret.png"): str(links / "missing.png"),
        str(links / "passwd"): str(cache / "planted" / "nothing-here"),
    }
    found = file_inputs(url)
    kinds = {(dep.get("api_name"), comp["type"]) for _, dep, _, comp, _ in found}
    # the page's own Run (private events) and the API's /encode, /sweep and /sweep_strip are all walked
    assert {("encode", "image"), ("encode", "video"), ("sweep", "file"), ("sweep_strip", "file")} <= kinds, kinds
    assert any(dep.get("api_visibility") == "private" for _, dep, _, _, _ in found)
    jobs = []  # (input, path, shape, data)
    for fn, dep, j, comp, comps in found:
        for existing, missing in pairs.items():
            for path in (existing, missing):
                for shape, payload in shapes(path).items():
                    data = defaults(dep, comps)
                    data[j] = payload
                    jobs.append(((fn, j), path, shape, data, dep))
    with ThreadPoolExecutor(8) as pool:  # the refusals are quick; the calls' round trips are not
        results = list(pool.map(lambda job: call(url, job[0][0], job[3], queued=job[4].get("queue", True) is not False),
                                jobs))
    for fn, dep, j, comp, comps in found:
        seen = set()
        for ((f, k), path, shape, _, _), (ok, msg) in zip(jobs, results):
            if (f, k) == (fn, j):
                assert not ok, (dep.get("api_name"), comp["type"], path, shape)
                seen.add(msg)
        assert len(seen) == 1, (dep.get("api_name"), comp["type"], seen)  # the same sentence for every path
        msg = seen.pop()
        assert isinstance(msg, str) and "only files uploaded" in msg and ":" in msg, msg
        assert "passwd" not in msg and "secret" not in msg and str(base) not in msg, msg


def test_an_uploaded_file_and_an_asset_still_encode(served):
    from gradio_client import handle_file

    client, cache, _ = served
    from .test_bad_inputs import CTL

    url = client.src.rstrip("/") + "/"
    fn = next(fn for fn, dep, _, _, _ in file_inputs(url) if dep.get("api_name") == "encode")
    status, *_ = client.predict("shapes-llava", "", "image", handle_file(EXAMPLE["path"]), None, EXAMPLE["prompt"],
                                *CTL, api_name="/encode")  # gradio_client uploads the file first
    assert "196 visual tokens" in status
    # the upload: Gradio keeps its name; not the links the test above planted, nor a panel the app drew
    name = os.path.basename(EXAMPLE["path"])
    uploaded = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs
                if f == name and not os.path.islink(os.path.join(d, f))]
    assert uploaded, sorted(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs)
    for payload in (shapes(uploaded[0])["tagged"], shapes(uploaded[0])["untagged"], shapes(EXAMPLE["path"])["untagged"]):
        ok, out = call(url, fn, [None, "shapes-llava", "", "image", payload, None, EXAMPLE["prompt"], *CTL])
        assert ok and "196 visual tokens" in out[1], (payload, out)


def folder_bytes(folder) -> int:
    return sum(os.stat(os.path.join(d, f), follow_symlinks=False).st_size for d, _, fs in os.walk(folder) for f in fs)


def example_urls(url: str) -> list[str]:
    """The URLs of every example's thumbnail on the page, and of every example file."""
    import httpx

    cfg = httpx.get(url + "config", timeout=30).json()
    table = next(c for c in cfg["components"] if c["type"] == "dataset" and c["props"].get("elem_id") == "examples")
    thumbs = [row[0]["url"] for row in table["props"]["samples"] if isinstance(row[0], dict)]
    files = [f"{url}gradio_api/file={e['path']}" for e in load_examples()]
    assert len(thumbs) == len(load_examples()) and thumbs, table["props"]["samples"]
    return [u if u.startswith("http") else url.rstrip("/") + "/" + u.lstrip("/") for u in thumbs] + files


def test_an_upload_flood_stops_at_the_cap_and_every_example_still_loads(fresh):
    import httpx

    from .test_bad_inputs import CTL, Raw

    client, cache, _ = fresh
    url = client.src.rstrip("/") + "/"
    blob = os.urandom(300_000)
    room = CAP - folder_bytes(cache)
    codes, refusals = [], set()
    for i in range(8):
        r = httpx.post(url + "gradio_api/upload", files={"files": (f"flood{i}.png", blob, "image/png")}, timeout=60)
        codes.append(r.status_code)
        if r.status_code != 200:
            refusals.add(r.text)
        assert folder_bytes(cache) <= CAP, (i, folder_bytes(cache))  # the cap holds after every upload
    taken = codes.index(413)  # uploads are taken while they fit (300 kB + the form's few hundred bytes each)
    assert room // 300_000 - 1 <= taken <= room // 300_000 and codes[taken:] == [413] * (8 - taken), (room, codes)
    assert refusals == {FULL.format(cap=CAP >> 20)}
    urls = example_urls(url)
    assert not any(str(cache) in u for u in urls), urls  # served from the package, not from the evictable cache
    for u in urls:
        assert httpx.get(u, timeout=30).status_code == 200, u
    # the app writes panels now (over the cap: its files budget prunes), and the examples still load
    raw = Raw(url)
    ok, out = raw.call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None, EXAMPLE["prompt"], *CTL])
    assert ok and "196 visual tokens" in out[1], out
    for _ in range(3):
        assert raw.call("view", CTL)[0]
    for u in urls:
        assert httpx.get(u, timeout=30).status_code == 200, u


def test_a_sibling_folder_that_starts_with_the_same_name_is_outside(tmp_path):
    """The folder checks compare whole path components: `/x/up` does not hold `/x/up-evil/...` or `/x/upx/...`
    (a prefix test without the separator would let them through; the files exist, so only the folder rule
    refuses them), for the upload guard and for the local-model folders alike."""
    from components.hosting.policy import ModelPolicy

    up = tmp_path / "up"
    up.mkdir()
    (up / "ok.png").write_bytes(b"x")
    for sibling in ("up-evil", "upx", "up.d"):
        (tmp_path / sibling).mkdir()
        (tmp_path / sibling / "x.png").write_bytes(b"x")
        (tmp_path / sibling / "model").mkdir()
    roots = real_roots([up])
    assert file_problem("image", {"path": str(up / "ok.png")}, roots) is None
    policy = ModelPolicy(model_dirs=(str(up),))
    (up / "model").mkdir()
    assert policy.refusal(str(up / "model")) == ""
    for sibling in ("up-evil", "upx", "up.d"):
        assert file_problem("image", {"path": str(tmp_path / sibling / "x.png")}, roots) == not_uploaded("image")
        assert "only from the folders it was started with" in policy.refusal(str(tmp_path / sibling / "model"))
