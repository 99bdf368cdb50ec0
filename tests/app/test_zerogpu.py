"""The app's handlers under ZeroGPU's process model, on the CPU: a stand-in `spaces` package whose
`GPU` runs each call in a forked process that receives its arguments and returns its result as
pickled bytes (as spaces/zero/wrappers.py does through its queues). Every handler gives what the
same handler gives in-process, and what the worker cached (the encoding, the answers) comes back
to the browser session's own state, under the app's byte cap."""
from __future__ import annotations

import sys

import pytest
import torch

from components.core.examples import load_examples
from components.core.logic import AppLogic, UIState
from components.core.settings import Settings

from ..paths import assert_paths_close

FORKING_SPACES = '''import functools, multiprocessing, pickle

TASKS = {}
CALLS = []


def GPU(duration=60):
    def wrap(fn):
        TASKS[fn.__name__] = fn

        @functools.wraps(fn)
        def call(*args, **kwargs):
            CALLS.append(fn.__name__)
            ctx = multiprocessing.get_context("fork")
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_run, args=(fn.__name__, pickle.dumps((args, kwargs)), w))
            p.start()
            w.close()
            ok, value = pickle.loads(r.recv_bytes())
            p.join(60)
            if not ok:
                raise value
            return value
        call.zerogpu = None  # what spaces sets on a ZeroGPU task
        return call
    return wrap


def _run(name, payload, w):
    import torch

    torch.set_num_threads(1)  # a forked child starts its own thread pool (as DataLoader workers do)
    try:
        args, kwargs = pickle.loads(payload)
        out = (True, TASKS[name](*args, **kwargs))
    except BaseException as e:
        out = (False, e)
    w.send_bytes(pickle.dumps(out))
'''

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")
SETTINGS = Settings(methods=("mi", "fastv", "random"), budget=16)


@pytest.fixture()
def zero(tmp_path, monkeypatch, hub):
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "__init__.py").write_text(FORKING_SPACES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    from components.hosting.spaces_gpu import gpu

    import spaces

    return AppLogic(hub, max_new_tokens=4, gpu=gpu), spaces


def test_every_handler_through_a_pickling_worker_gives_the_in_process_result(zero, hub):
    remote, spaces = zero
    local = AppLogic(hub, max_new_tokens=4)
    st, status = remote.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    here, _ = local.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    assert spaces.CALLS == ["encode"] and isinstance(st, UIState) and "visual tokens" in status
    assert st.key == here.key and st.session.keys() == [st.key] and st.session.budget is hub.cache
    enc = local._current(st)[1]  # the encoding came back on the host, in the session's own state
    # the forked worker is another process (another thread count, so other kernels): within tolerance
    assert enc.visual.device.type == "cpu"
    assert_paths_close(enc.visual, local._current(here)[1].visual, name="visual")

    views, summary = remote.view(st, SETTINGS)
    want, want_summary = local.view(here, SETTINGS)
    assert [v["keep"] for v in summary["methods"]] == [v["keep"] for v in want_summary["methods"]]
    assert all(torch.equal(a.selection.keep, b.selection.keep) for a, b in zip(views, want))

    answers = remote.generate(st, SETTINGS)
    strip = lambda a: {k: v for k, v in a.items() if not k.endswith("_ms")}  # noqa: E731  (timings differ)
    want_answers = local.generate(here, SETTINGS)
    assert strip(answers["reference"]) == strip(want_answers["reference"])
    assert {m: strip(a) for m, a in answers["methods"].items()} == {m: strip(a) for m, a in want_answers["methods"].items()}
    cached = local.cached_answers(st, SETTINGS)  # read in this process: the worker's answers came back
    assert set(cached["methods"]) == set(SETTINGS.methods) and cached["reference"] is not None

    box = enc.geometry.box[5].tolist()
    info = remote.inspect(st, SETTINGS, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    want_info = local.inspect(here, SETTINGS, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    assert {k: v for k, v in info.items() if k != "pmi"} == {k: v for k, v in want_info.items() if k != "pmi"}
    # PMI values shown to 5 decimals, from the worker's encoding (another process): the words exactly,
    # the values within one displayed unit plus the encodings' rounding
    assert [w for w, _ in info["pmi"]] == [w for w, _ in want_info["pmi"]]
    assert all(abs(a - b) <= 2e-5 for (_, a), (_, b) in zip(info["pmi"], want_info["pmi"]))
    assert spaces.CALLS == ["encode", "view", "generate", "inspect"]


def test_a_user_error_in_the_worker_reaches_the_page(zero):
    from components.core.logic import UserError

    remote, _ = zero
    with pytest.raises(UserError, match="the prompt is empty"):
        remote.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, "   ")


def test_a_session_pickles_with_its_entries_without_its_lock_and_cap(hub):
    """What a worker hands back: a session HOLDING an encoding, its MI normalisers and an answer (not an
    empty one) pickles without its lock and byte cap, and what it held serves the host unchanged."""
    import pickle

    from mipruner.serve.session import Session

    engine = hub.get(None)[0]
    s = engine.new_session()
    assert s.budget is hub.cache
    key = engine.encode(s, EXAMPLE["path"], EXAMPLE["prompt"], methods=("mi",))
    sel = engine.prune(s, key, "mi", 16)
    ans = engine.generate(s, key, "mi", 16, max_new_tokens=4)
    entry = s.entries[key]
    assert entry.mi_cache and entry.answers and entry.encoded.n_visual > 16  # the state is not empty
    back = pickle.loads(pickle.dumps(UIState(session=s, model="shapes-llava", key=key)))
    bs = back.session
    assert isinstance(bs, Session) and bs.budget is None and bs.uid == s.uid and bs.lock is not s.lock
    with bs.lock:
        pass
    assert back.key == key and bs.keys() == [key]
    got = bs.entries[key]
    assert torch.equal(got.encoded.visual, entry.encoded.visual) and got.encoded.prompt == entry.encoded.prompt
    assert sorted(map(repr, got.mi_cache)) == sorted(map(repr, entry.mi_cache))
    assert {k: a.token_ids for k, a in got.answers.items()} == {k: a.token_ids for k, a in entry.answers.items()}
    # the host reads the worker's cached answer without running the model, and prunes as before
    assert engine.cached_answer(bs, key, "mi", 16, max_new_tokens=4).token_ids == ans.token_ids
    assert torch.equal(engine.prune(bs, key, "mi", 16).keep, sel.keep)
    settings = Settings(methods=("mi", "dart"), budget=0.25, lam=0.5)
    assert pickle.loads(pickle.dumps(settings)).to_string() == settings.to_string()


def test_move_tensors_reaches_nested_state_and_leaves_the_rest():
    from dataclasses import dataclass

    from components.hosting.spaces_gpu import move_tensors

    @dataclass(frozen=True)
    class Box:
        t: torch.Tensor
        name: str

    model = torch.nn.Linear(2, 2)
    pair = (torch.zeros(2), "x")
    obj = {"a": [torch.ones(1), Box(torch.ones(3), "b")], "m": model, "p": pair, "same": pair}
    out = move_tensors(obj, torch.device("meta"))
    assert out is obj and obj["a"][0].is_meta and obj["a"][1].t.is_meta and obj["a"][1].name == "b"
    assert obj["p"][0].is_meta and obj["p"] is obj["same"]  # a tuple is rebuilt once, shared stays shared
    assert obj["m"] is model and not model.weight.is_meta  # models are left alone


def test_on_zero_gpu_reads_the_spaces_config(tmp_path, monkeypatch):
    from components.hosting.spaces_gpu import on_zero_gpu

    for flag in (True, False):
        pkg = tmp_path / str(flag) / "spaces"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "config.py").write_text(f"class Config:\n    zero_gpu = {flag}\n")
        monkeypatch.syspath_prepend(str(pkg.parent))
        for m in ("spaces", "spaces.config"):
            monkeypatch.delitem(sys.modules, m, raising=False)
        assert on_zero_gpu() is flag
