"""The embedded model through lmms-eval (1 and 2 processes) = `python -m mipruner.eval`; sweeps; resuming.

Offline and on CPU: the shapes tasks are written to a temporary folder by
`mipruner.lmms.make_tasks`, and every run reads lmms-eval's results and sample files (lmms-eval
exits 0 even when a run fails, so the exit code proves nothing). The one-process run is a
two-run sweep (`method=mi|random`: MI, then Random) sharing one model load and one encoding per item.
"""
import glob
import json
import os
import socket
import subprocess
import sys

import pytest

if os.environ.get("MIPRUNER_REQUIRE_LMMS"):  # CI: a missing lmms-eval fails instead of skipping
    import lmms_eval  # noqa: F401
else:
    pytest.importorskip("lmms_eval", reason="lmms-eval is installed by .ci/run (requirements-lmms.txt)")

import mipruner  # noqa: E402
from mipruner.eval.__main__ import main as eval_main  # noqa: E402
from mipruner.eval.shapes import shapes_items  # noqa: E402
from mipruner.lmms.make_tasks import write_shapes_tasks  # noqa: E402
from mipruner.lmms.model import ABORT_ENV, SWEEP_ENV  # noqa: E402
from mipruner.shapes.scenes import POPE_SPLITS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_POPE, N_OPEN, SEED, BUDGET = 6, 8, 1234, 16  # 18 POPE items (6 per split) + 8 open questions
MODEL_ARGS = f"pretrained=shapes-llava,method=mi,budget={BUDGET},lam=1"  # text_mode: the default, question
TASKS = "shapes_pope,shapes_open"
N_ITEMS = 3 * N_POPE + N_OPEN
KILLED_AFTER = 9  # the interrupted run kills itself after caching this many answers


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shapes_tasks"))
    write_shapes_tasks(out, n=N_POPE, seed=SEED, tasks=("pope",))
    opened = str(tmp_path_factory.mktemp("shapes_open"))  # --n is per task: the open task gets its own
    write_shapes_tasks(opened, n=N_OPEN, seed=SEED, tasks=("open",))
    os.replace(os.path.join(opened, "shapes_open.yaml"), os.path.join(out, "shapes_open.yaml"))
    os.replace(os.path.join(opened, "data", "shapes_open.parquet"), os.path.join(out, "data", "shapes_open.parquet"))
    return out


def _env(tmp, extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", HF_DATASETS_CACHE=os.path.join(tmp, "hf_datasets"),
               CUDA_VISIBLE_DEVICES="",  # CPU, like the reference, on any machine
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(ABORT_ENV, None)
    env.pop(SWEEP_ENV, None)
    env.update(extra or {})
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One lmms-eval launch in the background; `wait()` -> (exit code, stdout + stderr)."""

    def __init__(self, task_dir, out, cache=None, processes=1, extra_env=None, model_args=MODEL_ARGS):
        args = ["-m", "mipruner.lmms", "--model", "mipruner",
                "--model_args", model_args + (f",cache_dir={cache}" if cache else ""),
                "--tasks", TASKS, "--include_path", task_dir, "--batch_size", "1",
                "--log_samples", "--output_path", out]
        if processes == 1:
            cmd = [sys.executable] + args
        else:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(_free_port())] + args
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.log_path = out + ".log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(os.path.dirname(out), extra_env), stdout=self._log,
                                     stderr=subprocess.STDOUT, text=True)

    def wait(self):
        try:
            rc = self.proc.wait(timeout=600)
        finally:
            self._log.close()
        with open(self.log_path) as f:
            return rc, f.read()


def read_run(out):
    """(results, {task: {doc_id: answer}}) of the one run under `out`."""
    found = glob.glob(os.path.join(out, "**", "*_results.json"), recursive=True)
    assert len(found) == 1, f"expected one results file under {out}, found {found}"
    with open(found[0]) as f:
        results = json.load(f)
    answers = {}
    for path in glob.glob(os.path.join(os.path.dirname(found[0]), "*_samples_*.jsonl")):
        task = path.rsplit("_samples_", 1)[1][: -len(".jsonl")]
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        answers[task] = {r["doc_id"]: (r["filtered_resps"][0] if isinstance(r["filtered_resps"], list)
                                       else r["filtered_resps"]) for r in rows}
    return results, answers


@pytest.fixture(scope="module")
def reference(tmp_path_factory, monkeypatch_module):
    """`python -m mipruner.eval` on the same items: its rows, and its per-item answers (recorded)."""
    texts = []
    real_load = mipruner.load

    def load(*a, **k):
        adapter = real_load(*a, **k)
        gen = adapter.generate

        def generate(*ga, **gk):
            out = gen(*ga, **gk)
            texts.append(out.text)
            return out

        adapter.generate = generate
        return adapter

    monkeypatch_module.setattr(mipruner, "load", load)
    tmp = tmp_path_factory.mktemp("reference")
    ref = {}
    for task, n in (("shapes-pope", N_POPE), ("shapes-open", N_OPEN)):
        texts.clear()
        eval_main(["--model", "shapes-llava", "--task", task, "--n", str(n), "--seed", str(SEED),
                   "--methods", "mi,random",
                   "--budgets", str(BUDGET), "--lam", "1", "--text-mode", "question", "--device", "cpu", "--no-batch",
                   "--json", str(tmp / f"{task}.json"), "--no-progress"])
        with open(tmp / f"{task}.json") as f:
            rows = json.load(f)
        # per item: the unpruned answer, MI's, then Random's with seeds 0, 1, 2
        ref[task] = ({(r["method"], r["split"]): r for r in rows}, texts[1::5], texts[0::5], texts[2::5])
    return ref


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def check_same_as_eval(results, answers, reference):
    row, mi, unpruned, _ = reference["shapes-pope"]
    items = shapes_items("shapes-pope", n=N_POPE, seed=SEED)
    for split in POPE_SPLITS:
        idx = [i for i, it in enumerate(items) if it.split == split]
        got = answers[f"shapes_pope_{split}"]
        assert [got[j] for j in range(len(idx))] == [mi[i] for i in idx], split
        res = results["results"][f"shapes_pope_{split}"]
        for k in ("acc", "f1", "yes_rate"):
            assert res[f"{k},none"] == pytest.approx(row[("mi", split)][k], abs=1e-12), (split, k)
    for k in ("acc", "f1", "yes_rate"):  # the group: the unweighted mean over the splits, as the runner's
        assert results["results"]["shapes_pope"][f"{k},none"] == pytest.approx(row[("mi", "average")][k], abs=1e-12)
    pruned_differs = mi != unpruned
    row, mi, unpruned, _ = reference["shapes-open"]
    got = answers["shapes_open"]
    assert [got[j] for j in range(N_OPEN)] == mi
    assert results["results"]["shapes_open"]["acc,none"] == pytest.approx(row[("mi", "all")]["acc"], abs=1e-12)
    # the method took effect: some MI answer at 16 of the 196 tokens differs from the unpruned one
    assert pruned_differs or mi != unpruned


@pytest.fixture(scope="module")
def single_runs(task_dir, tmp_path_factory):
    """Both one-process launches at once (they are independent): a sweep, and a run killed mid-way."""
    tmp = tmp_path_factory.mktemp("single")
    # one command, two runs: "mi|random" expands to MI (lam=1) and Random (lam is not one of its settings)
    full = Run(task_dir, str(tmp / "full"), cache=str(tmp / "sweep_cache"),
               model_args=f"pretrained=shapes-llava,method=mi|random,budget={BUDGET},lam=1")
    killed = Run(task_dir, str(tmp / "killed" / "out"), cache=str(tmp / "cache"),
                 extra_env={ABORT_ENV: str(KILLED_AFTER)})
    return {"full": (full, str(tmp / "full")), "killed": (killed, str(tmp / "killed" / "out"), str(tmp / "cache"))}


@pytest.fixture(scope="module")
def sweep(single_runs):
    run, out = single_runs["full"]
    rc, log = run.wait()
    assert rc == 0, log[-5000:]
    return {m: read_run(os.path.join(out, f"{m}_{BUDGET}")) for m in ("mi", "random")}, log


@pytest.fixture(scope="module")
def one_process(sweep):
    return sweep[0]["mi"]


def test_one_process_equals_mipruner_eval(one_process, reference):
    results, answers = one_process
    assert sum(len(a) for a in answers.values()) == N_ITEMS
    check_same_as_eval(results, answers, reference)


def test_sweep_loads_once_encodes_once(sweep, reference):
    runs, log = sweep
    assert log.count("mipruner: loaded shapes-llava") == 1
    # the first run answered both configurations on each encoding; the second only read them
    assert f"mipruner rank 0: {2 * N_ITEMS} answers computed, 0 from the cache" in log
    assert f"mipruner rank 0: 0 answers computed, {N_ITEMS} from the cache" in log
    # ... and Random's answers (seed 0) are those of `python -m mipruner.eval` (its first seed)
    _, answers = runs["random"]
    items = shapes_items("shapes-pope", n=N_POPE, seed=SEED)
    random_pope = reference["shapes-pope"][3]
    for split in POPE_SPLITS:
        idx = [i for i, it in enumerate(items) if it.split == split]
        assert [answers[f"shapes_pope_{split}"][j] for j in range(len(idx))] == [random_pope[i] for i in idx]
    assert [answers["shapes_open"][j] for j in range(N_OPEN)] == reference["shapes-open"][3]
    assert answers != runs["mi"][1]


def test_two_processes_equal_mipruner_eval(task_dir, tmp_path, reference, one_process):
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    rc, log = Run(task_dir, out, cache=cache, processes=2).wait()
    assert rc == 0, log[-5000:]
    # two ranks really ran: each answered its share of the documents, in its own process
    counts = {}
    for rank in (0, 1):
        with open(os.path.join(cache, f"answers.rank{rank}.jsonl")) as f:
            counts[rank] = sum(1 for line in f if line.strip())
        assert f"mipruner rank {rank}: {counts[rank]} answers computed, 0 from the cache" in log
    assert counts[0] > 0 and counts[1] > 0 and counts[0] + counts[1] == N_ITEMS, counts
    results, answers = read_run(out)
    check_same_as_eval(results, answers, reference)
    assert answers == one_process[1]


def test_interrupted_run_resumes_without_redoing_samples(single_runs, task_dir, tmp_path, one_process):
    run, killed_out, cache = single_runs["killed"]
    rc, log = run.wait()
    assert rc == -9, log[-5000:]  # killed (SIGKILL) mid-run: no results written
    assert not glob.glob(os.path.join(os.path.dirname(killed_out), "**", "*_results.json"), recursive=True)
    with open(os.path.join(cache, "answers.rank0.jsonl")) as f:
        assert sum(1 for line in f if line.strip()) == KILLED_AFTER
    out = str(tmp_path / "out")
    rc, log = Run(task_dir, out, cache=cache).wait()
    assert rc == 0, log[-5000:]
    # fewer model calls: only the samples the killed run had not answered
    assert f"mipruner rank 0: {N_ITEMS - KILLED_AFTER} answers computed, {KILLED_AFTER} from the cache" in log
    results, answers = read_run(out)
    assert answers == one_process[1]
    ref = one_process[0]["results"]
    for task, res in ref.items():
        for key, value in res.items():
            if key.split(",")[0] in ("acc", "f1", "yes_rate", "precision", "recall"):
                assert results["results"][task][key] == value, (task, key)
