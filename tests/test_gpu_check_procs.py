"""gpu-check's robustness: each family in its own process (an abort costs only that family's rows,
marked with the cause, after one retry with CUDA_LAUNCH_BLOCKING=1), rows with non-finite logits
fail, `--cells` runs only the protocol's cells asked for, and the random builders draw their weights
in the target dtype with rotary `inv_freq` in float32 (the plan and the merge of several commands:
tests/test_gpu_check_plan.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mipruner.bench import gpu_check, zoo
from mipruner.bench.finite_logits import LogitWatch
from mipruner.bench.gpu_check_protocol import CELLS, run_protocol
from mipruner.bench.gpu_check_rows import KEEP_ALL, Clock, check_media
from mipruner.models.common.random_build import build_model, rotary_in_float32
from mipruner.pruners import Selection, get_pruner, list_pruners, register_pruner, unregister_pruner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A plug-in method that aborts the process in the rows (under inference mode, not in the plug-in's
# load-time check) of qwen2_vl always, and of qwen3_vl only without CUDA_LAUNCH_BLOCKING=1 (so the
# retry saves it); elsewhere it keeps the first `budget` tokens.
ABORTING_PLUGIN = textwrap.dedent('''
    import os, sys
    import torch
    import mipruner
    from mipruner.pruners import Selection

    @mipruner.register_pruner("gpu_check_abort", label="aborts in some families")
    def gpu_check_abort(visual, text, budget):
        fam = sys.argv[sys.argv.index("--families") + 1] if "--families" in sys.argv else ""
        retry = os.environ.get("CUDA_LAUNCH_BLOCKING") == "1"
        if torch.is_inference_mode_enabled() and (fam == "qwen2_vl" or (fam == "qwen3_vl" and not retry)):
            os.abort()
        n = visual.shape[0]
        return Selection.from_order(torch.arange(n, device=visual.device)[:budget], torch.zeros(n, device=visual.device))
''')


def test_an_aborting_family_costs_only_its_rows(tmp_path):
    plugin = tmp_path / "aborting.py"
    plugin.write_text(ABORTING_PLUGIN)
    out = tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "mipruner.bench", "gpu-check", "--tiny", "--device", "cpu", "--isolate",
                        "family", "--families", "llava,qwen2_vl,qwen3_vl", "--media", "image", "--methods",
                        "gpu_check_abort", "--shares", "0.25", "--plugins", str(plugin), "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert p.returncode == 1, log[-3000:]
    rows = {(r["family"], r["method"]): r for r in report["rows"]}
    assert len(report["rows"]) == len(rows) == 3 * 2  # every family's anchor and method row, once each
    for fam in ("llava", "qwen3_vl"):  # the others: all ok (qwen3_vl on its retry)
        assert rows[(fam, KEEP_ALL)]["ok"] and rows[(fam, "gpu_check_abort")]["ok"], log[-3000:]
    assert rows[("qwen2_vl", KEEP_ALL)]["ok"]  # finished before the abort: kept
    dead = rows[("qwen2_vl", "gpu_check_abort")]
    assert not dead["ok"] and dead["error"].startswith("the process died in this row (killed by SIGABRT")
    assert "Fatal Python error: Aborted" in dead["error"] and "in gpu_check_abort" in dead["error"]
    info = {f["family"]: f for f in report["families"]}
    assert [a["env"] for a in info["qwen2_vl"]["attempts"]] == [{}, {"CUDA_LAUNCH_BLOCKING": "1"}]
    assert [a["rc"] for a in info["qwen2_vl"]["attempts"]] == [-6, -6] and "error" in info["qwen2_vl"]
    assert [a["rc"] for a in info["qwen3_vl"]["attempts"]] == [-6, 0] and info["qwen3_vl"]["n_visual"] > 0
    assert [a["rc"] for a in info["llava"]["attempts"]] == [0]
    assert "qwen2_vl: again with CUDA_LAUNCH_BLOCKING=1" in log and "failing rows:" in log


def test_a_cuda_fault_ends_the_process_rows_in_one_process(tmp_path):
    """--isolate none: after a CUDA fault (here raised by a method) no later row runs in the process;
    each is marked with the fault, the rows before it stand."""
    @register_pruner("gpu_check_cuda_fault", label="fault")
    def fault(visual, text, budget):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    out = tmp_path / "r.json"
    try:
        rc = gpu_check.main(["--tiny", "--device", "cpu", "--isolate", "none", "--families", "llava,qwen2_vl", "--media",
                             "image", "--methods", "mi,gpu_check_cuda_fault", "--shares", "0.25", "--json", str(out)])
    finally:
        unregister_pruner("gpu_check_cuda_fault")
    rows = json.loads(out.read_text())["rows"]
    assert rc == 1 and [(r["family"], r["method"]) for r in rows] == [
        (f, m) for f in ("llava", "qwen2_vl") for m in (KEEP_ALL, "mi", "gpu_check_cuda_fault")]
    assert rows[0]["ok"] and rows[1]["ok"]
    assert rows[2]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert all(not r["ok"] and r["error"].startswith("not run: a CUDA fault ended this process's CUDA context")
               for r in rows[3:])


@pytest.fixture(scope="module")
def tiny_llava():
    return zoo.get_family("llava").build(tiny=True, device="cpu", dtype=torch.float32, seed=0)[0]


def test_a_row_with_nan_logits_is_not_ok(tiny_llava):
    """A method after whose selection the LM head returns NaN: its rows fail, though its greedy answers have tokens."""
    poison = [False]

    @register_pruner("gpu_check_nan", label="nan")
    def nan_method(visual, text, budget):
        poison[0] = True
        n = visual.shape[0]
        return Selection.from_order(torch.arange(budget, device=visual.device), torch.zeros(n, device=visual.device))

    head = tiny_llava.output_head()
    hooks = len(head._forward_hooks)
    handle = head.register_forward_hook(lambda m, args, out: out * float("nan") if poison[0] else None)
    try:
        rows, info = check_media(tiny_llava, "llava", "image", zoo.make_media("image", True), zoo.PROMPTS["image"],
                                 ["random", "gpu_check_nan"], [0.25, 0.1], 3, Clock(torch.device("cpu")),
                                 log=lambda *_: None)
    finally:
        handle.remove()
        unregister_pruner("gpu_check_nan")
    assert len(head._forward_hooks) == hooks  # the watch's hooks are gone
    by = {(r["method"], r["budget"]): r for r in rows}
    assert all(by[k]["ok"] for k in [(KEEP_ALL, 1.0), ("random", 0.25), ("random", 0.1)])
    for share in (0.25, 0.1):
        r = by[("gpu_check_nan", share)]
        assert not r["ok"] and r["error"].startswith("RuntimeError: non-finite logits (NaN or inf) in the row's answers")
        assert r["kept"] == max(1, int(share * r["n_visual"] + 0.5)) and r["answer_ms"] > 0  # it answered


def test_logit_watch(tiny_llava):
    enc = tiny_llava.encode(zoo.make_media("image", True), "what?")
    with torch.inference_mode(), LogitWatch(tiny_llava) as w:
        tiny_llava.generate(enc, None, max_new_tokens=2)
    assert w.all_finite() is True and w.calls >= 1
    w.check("x")  # no raise
    with LogitWatch(tiny_llava) as idle:
        pass
    assert idle.all_finite() is None and idle.calls == 0


def _timed(p):
    return [(c.get("phase"), c.get("kind")) for c in p["cells"] if "phase" in c]


def test_cells_run_only_those_asked(tiny_llava):
    kw = dict(budget_s=600, repeats=1, warmup=0, batches=(1, 2), log=lambda *_: None)
    p = run_protocol(tiny_llava, groups=("view", "select"), **kw)
    assert p["cells_asked"] == ["select", "view"] and p["skipped"] == []
    assert [c["method"] for c in p["cells"] if c.get("cell") == "select"] == [
        m for m in list_pruners() if not get_pruner(m).video]  # an image: the video methods do not apply
    assert _timed(p) == [("eager", "view")] * 3 and p["goals"]["six_answers_vs_one"] > 0
    assert p["goals"]["slider_view_vs_one"] > 0
    assert p["goals"]["mi_vs_generate_eager"] is None
    p = run_protocol(tiny_llava, groups=("latency",), **kw)
    assert _timed(p) == [("eager", "latency")] * 3 and not [c for c in p["cells"] if c.get("cell") == "select"]
    assert p["goals"]["mi_vs_generate_eager"] > 0 and p["skipped"] == []
    p = run_protocol(tiny_llava, groups=("batch", "compiled"), compiled=True, **kw)
    assert {x for x in _timed(p)} == {("eager", "throughput"), ("compiled", "latency"), ("compiled", "throughput")}
    assert tiny_llava.decode_path.plain  # the plain path restored after the compiled phase
    with pytest.raises(ValueError, match="unknown protocol cells"):
        run_protocol(tiny_llava, groups=("views",), **kw)
    with pytest.raises(SystemExit, match="unknown protocol cell 'views'"):
        gpu_check.main(["--tiny", "--device", "cpu", "--protocol-only", "--cells", "views"])


def test_protocol_only_command(tmp_path):
    out = tmp_path / "p.json"
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--protocol-only", "--cells", "latency", "--repeats", "1",
                         "--warmup", "0", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["rows"] == [] and report["families"] == []
    assert report["protocol"]["cells_asked"] == ["latency"] and _timed(report["protocol"]) == [("eager", "latency")] * 3


@pytest.mark.parametrize("name", list(zoo.FAMILIES))
def test_random_builders_in_the_target_dtype_with_float32_rotary(name):
    """Real shapes on the meta device and tiny ones on the CPU: every parameter in the target dtype,
    every rotary inv_freq in float32 (real checkpoints keep them so; a cast model had them in bf16)."""
    build = zoo.get_family(name).build
    for adapter, dtype in [(build(tiny=False, device="meta", dtype=torch.bfloat16, seed=0)[0], torch.bfloat16),
                           (build(tiny=True, device="cpu", dtype=torch.float16, seed=0)[0], torch.float16)]:
        assert {p.dtype for p in adapter.model.parameters()} == {dtype}
        inv = [b for n, b in adapter.model.named_buffers() if n.endswith("inv_freq")]
        assert inv and all(b.dtype == torch.float32 for b in inv)
        assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_no_float32_model_is_built_first():
    """LLaVA-1.5-7B's shape on the meta device: no float32 tensor larger than a rotary table is created
    while it builds in bf16 (the old build made a float32 model and cast it: 28 GB for a moment)."""
    made = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                made.append(out.numel())
            return out

    with Record():
        zoo.get_family("llava").build(tiny=False, device="meta", dtype=torch.bfloat16, seed=0)
    assert made and max(made) < 1_000_000  # rotary tables and such, no weight matrix


def test_rotary_in_float32_casts_and_keeps_buffers():
    m = torch.nn.Module()
    m.register_buffer("inv_freq", torch.ones(4, dtype=torch.bfloat16), persistent=False)
    m.original_inv_freq = torch.ones(4, dtype=torch.bfloat16)
    assert rotary_in_float32(m) == 2
    assert m.inv_freq.dtype == m.original_inv_freq.dtype == torch.float32 and "inv_freq" in dict(m.named_buffers())
    lin = build_model(lambda cfg: torch.nn.Linear(cfg, cfg), 3, device="meta", dtype=torch.float16)
    assert lin.weight.dtype == torch.float16 and lin.weight.is_meta and not lin.training
    assert set(CELLS) == {"select", "latency", "batch", "view", "compiled"}


def test_child_arguments_and_causes():
    from mipruner.bench.gpu_check_procs import cause, child_args

    a = gpu_check.parse_args(["--tiny", "--device", "cpu", "--methods", "mi,random", "--shares", "0.5", "--cells",
                              "view", "--llm-layers", "3", "--static-cache", "--no-protocol"])
    args = child_args(a, families="qwen2_vl", json="x.json", child=True)
    b = gpu_check.parse_args(args)
    assert (b.tiny, b.device, b.methods, b.shares, b.cells, b.llm_layers, b.static_cache, b.protocol, b.child) == (
        True, "cpu", "mi,random", "0.5", "view", 3, True, False, True)
    assert b.families == "qwen2_vl" and b.json == "x.json" and "--media" not in args  # defaults left out
    tail = ["  qwen2_vl image: ...", "Fatal Python error: Aborted", "", "Current thread 0x1 (most recent call first):",
            '  File "p.py", line 9 in f', '  File "q.py", line 3 in g', "Extension modules: torch._C (total: 1)"]
    assert cause(-6, tail) == 'killed by SIGABRT: Fatal Python error: Aborted at File "p.py", line 9 in f'
    assert cause(3, ["x", "CUDA fault: RuntimeError: CUDA error: an illegal memory access was encountered"]) == (
        "exit code 3 after a CUDA fault: CUDA fault: RuntimeError: CUDA error: an illegal memory access was encountered")
    assert cause(1, ["ModuleNotFoundError: No module named 'x'", "done"]) == (
        "exit code 1: ModuleNotFoundError: No module named 'x'")
