"""`python -m tests.gpu_check run` on the CPU (tiny random models): every family of the zoo x its
media x every registered method x 2 budget shares + the keep-all anchor, each row ok; a method that
raises is recorded with its error and the run goes on (exit code 1); a keep-all answer that differs
from the unpruned one fails its row; the report's keys; the protocol's cells within its time budget;
and each random builder's tiny model encodes every medium it takes and answers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import mipruner
from mipruner.bench import zoo
from mipruner.pruners import Selection, get_pruner, list_pruners, register_pruner, unregister_pruner

from tests.gpu_check import check as gpu_check
from tests.gpu_check.rows import FIELDS, KEEP_ALL, Clock, check_media

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT_KEYS = {"device", "torch", "transformers", "dtype", "tiny", "llm_layers", "command", "rows", "protocol",
               "families", "shares", "new_tokens", "static_cache", "methods", "wall_s"}
SHARES = [0.25, 0.1]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The CI command itself, in a subprocess: (exit code, report, stdout)."""
    out = tmp_path_factory.mktemp("gpu_check") / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tests.gpu_check", "run", "--tiny", "--device", "cpu", "--json",
                        str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return p.returncode, json.loads(out.read_text()), p.stdout + p.stderr


def test_tiny_cpu_run_every_row_ok(full_run):
    rc, report, log = full_run
    bad = [r for r in report["rows"] if not r["ok"]]
    assert rc == 0 and not bad, (bad, log[-3000:])
    want = sorted((f.name, m, meth, s) for f in zoo.FAMILIES.values() for m in f.media
                  for meth, s in [(KEEP_ALL, 1.0)] + [(x, y) for x in list_pruners() for y in SHARES
                                                       if m == "video" or not get_pruner(x).video])
    got = sorted((r["family"], r["media"], r["method"], r["budget"]) for r in report["rows"])
    assert got == want  # every family x its media x every method x 2 shares + the anchor, once each
    assert {"image", "images", "video"} <= {r["media"] for r in report["rows"]}
    assert {f.name for f in zoo.FAMILIES.values()} == {r["family"] for r in report["rows"]}


def test_report_schema_and_values(full_run):
    _, report, log = full_run
    assert set(report) == REPORT_KEYS
    assert report["device"] == "cpu" and report["dtype"] == "fp32" and report["tiny"] is True
    assert report["llm_layers"] is None  # the configs' depth unless --llm-layers
    assert report["torch"] == torch.__version__ and report["protocol"] is None  # off on the CPU unless asked
    assert report["command"].startswith("python -m tests.gpu_check run --tiny")
    for r in report["rows"]:
        assert set(r) == set(FIELDS) and r["error"] is None
        assert r["peak_mb"] is None  # CPU: not measured
        assert r["select_ms"] >= 0 and r["answer_ms"] > 0 and r["batch_ms"] > 0
        if r["method"] == KEEP_ALL:
            assert r["kept"] == r["n_visual"]
        else:
            assert 1 <= r["kept"] <= max(1, int(r["budget"] * r["n_visual"] + 0.5))
    # budgets scale with the shape: one method's kept counts differ across encodings of different N_V
    kept = {(r["n_visual"], r["kept"]) for r in report["rows"] if r["method"] == "random" and r["budget"] == 0.25}
    assert len({n for n, _ in kept}) > 3 and all(k == int(0.25 * n + 0.5) for n, k in kept)
    # the anchor compares something: pruned answers differ from the unpruned one somewhere
    ref = {(f["family"], f["media"]): f["unpruned_tokens"] for f in report["families"]}
    assert len(ref) == sum(len(f.media) for f in zoo.FAMILIES.values())
    assert len({tuple(v) for v in ref.values()}) > 5
    assert "rows ok on cpu" in log and "family" in log and "select ms" in log


@pytest.fixture(scope="module")
def tiny_llava():
    return zoo.get_family("llava").build(tiny=True, device="cpu", dtype=torch.float32, seed=0)[0]


def test_a_failing_method_is_recorded_and_the_run_goes_on(tmp_path, capsys):
    @register_pruner("gpu_check_broken", label="broken")
    def broken(visual, text, budget):
        raise RuntimeError("this method is broken on purpose")

    @register_pruner("gpu_check_too_many", label="too many")
    def too_many(visual, text, budget):  # keeps every token whatever the budget
        n = visual.shape[0]
        order = torch.arange(n, device=visual.device)
        return Selection.from_order(order, torch.zeros(n, device=visual.device))

    try:
        out = tmp_path / "r.json"
        rc = gpu_check.main(["--tiny", "--device", "cpu", "--families", "llava,qwen2_vl", "--media", "image",
                             "--methods", "mi,gpu_check_broken,gpu_check_too_many,fastv", "--json", str(out)])
    finally:
        unregister_pruner("gpu_check_broken")
        unregister_pruner("gpu_check_too_many")
    assert rc == 1
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * (1 + 4 * 2)  # both families ran to the end
    for r in rows:
        if r["method"] == "gpu_check_broken":
            assert not r["ok"] and r["error"] == "RuntimeError: this method is broken on purpose"
        elif r["method"] == "gpu_check_too_many":
            # a method registered outside mipruner is contract-checked at select (as a plug-in is)
            assert not r["ok"] and "broke the selection contract: keep has shape" in r["error"], r["error"]
        else:
            assert r["ok"] and r["error"] is None, r
    printed = capsys.readouterr().out
    assert "failing rows:" in printed and printed.count("gpu_check_broken") >= 4


def test_static_cache_rows(tmp_path):
    """--static-cache: the rows answer on the GPU decoding path (bucketed lengths, static KV cache)."""
    out = tmp_path / "r.json"
    rc = gpu_check.main(["--tiny", "--device", "cpu", "--families", "llava,qwen3_vl", "--media", "video",
                         "--methods", "mi,fastv", "--json", str(out), "--static-cache"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["static_cache"] is True and len(report["rows"]) == 2 * (1 + 2 * 2)
    assert all(r["ok"] for r in report["rows"])


def test_keep_all_anchor_fails_when_the_answers_differ(tiny_llava, monkeypatch):
    """An adapter whose keep-all answer is not its unpruned answer fails the anchor row only."""
    real = type(tiny_llava).generate

    def generate(self, encoded, keep=None, *args, **gen):  # the caller's arguments as they come (config= or keywords)
        ans = real(self, encoded, keep, *args, **gen)
        if keep is not None and not isinstance(keep, Selection):
            ans.token_ids = [t + 1 for t in ans.token_ids]  # a keep-all path that changed the model
        return ans

    monkeypatch.setattr(tiny_llava, "generate", generate.__get__(tiny_llava))
    rows, info = check_media(tiny_llava, "llava", "image", zoo.make_media("image", True), zoo.PROMPTS["image"],
                             ["random"], SHARES, 3, Clock(torch.device("cpu")), log=lambda *_: None)
    anchor, *others = rows
    assert anchor["method"] == KEEP_ALL and not anchor["ok"]
    assert anchor["error"].startswith("RuntimeError: keep-all answer") and "!= unpruned answer" in anchor["error"]
    assert all(r["ok"] for r in others) and info["n_visual"] == anchor["n_visual"] == anchor["kept"]


@pytest.mark.parametrize("logits_equal", [True, False])
def test_keep_all_anchor_when_the_unpruned_answer_is_not_reproducible(tiny_llava, monkeypatch, logits_equal):
    """Seen on an H100 in bf16: `generate` gave two different greedy answers on the same inputs. Then the
    anchor asks the unpruned answer again; when that differs too, the prefill logits decide (bit-equal: ok,
    with a note; different: the anchor fails)."""
    real, real_logits = type(tiny_llava).generate, type(tiny_llava).prefill_logits
    calls = {"none": 0}

    def generate(self, encoded, keep=None, max_new_tokens=64, **gen):
        ans = real(self, encoded, keep, max_new_tokens=max_new_tokens, **gen)
        if keep is None:
            calls["none"] += 1
            if calls["none"] == 1:  # the first unpruned draw: a near-tie that went the other way
                ans.token_ids = [t + 1 for t in ans.token_ids]
        return ans

    def prefill_logits(self, encoded, keep=None, positions=None):
        out = real_logits(self, encoded, keep, positions)
        return out if logits_equal or keep is None else out + 1

    monkeypatch.setattr(tiny_llava, "generate", generate.__get__(tiny_llava))
    monkeypatch.setattr(tiny_llava, "prefill_logits", prefill_logits.__get__(tiny_llava))
    rows, _ = check_media(tiny_llava, "llava", "image", zoo.make_media("image", True), zoo.PROMPTS["image"],
                          ["random"], SHARES, 3, Clock(torch.device("cpu")), log=lambda *_: None)
    anchor = rows[0]
    assert anchor["method"] == KEEP_ALL and calls["none"] >= 2
    if logits_equal:
        assert anchor["ok"] and "not reproducible" in anchor["note"], anchor
    else:
        assert not anchor["ok"] and "prefill logits differ" in anchor["error"], anchor


def test_media_that_fail_to_encode_fail_their_rows(tiny_llava):
    rows, info = check_media(tiny_llava, "llava", "image", object(), "what?", ["mi"], SHARES, 2,
                             Clock(torch.device("cpu")), log=lambda *_: None)
    assert len(rows) == 3 and not any(r["ok"] for r in rows)
    assert all(r["error"].startswith("encode / unpruned answer failed:") for r in rows) and "error" in info


def test_protocol_cells_and_time_budget(tiny_llava):
    from tests.gpu_check.protocol import run_protocol

    seen = []
    p = run_protocol(tiny_llava, budget_s=600, repeats=1, warmup=0, batches=(1, 2), log=lambda *_: None,
                     progress=lambda rep: seen.append(len(rep["cells"])))
    sel = [c for c in p["cells"] if c.get("cell") == "select"]
    image_methods = [m for m in list_pruners() if not get_pruner(m).video]  # the protocol reads an image
    assert [c["method"] for c in sel] == image_methods and all(c["median_ms"] > 0 for c in sel)
    timed = {(c["phase"], c["kind"], c["method"], c["batch"]) for c in p["cells"] if "phase" in c}
    assert {("eager", "latency", "generate", 1), ("eager", "latency", "mi:lam=1", 1),
            ("eager", "throughput", "none", 2), ("eager", "throughput", "mi:lam=1", 2)} <= timed
    assert p["budget_tokens"] == 4  # a quarter of the tiny model's 16 visual tokens
    assert all(c["new_tokens"] == 2 for c in p["cells"] if "phase" in c)
    n_sel = len(image_methods)
    assert seen == list(range(n_sel + 1, len(p["cells"]) + 1))  # the report so far, after every timed cell
    assert p["skipped"] == [{"phase": "compiled", "why": "compiled cells run on CUDA only (or compiled=True)"}]
    g = p["goals"]
    assert g["mi_vs_generate_eager"] > 0 and g["six_answers_vs_one"] > 0 and g["mi_vs_generate_compiled"] is None
    assert set(g["select_median_ms"]) == set(image_methods)
    # a spent budget: no timed cell starts, each one is listed with the reason
    none = run_protocol(tiny_llava, budget_s=0, repeats=1, warmup=0, batches=(1,), log=lambda *_: None)
    assert not [c for c in none["cells"] if "phase" in c]
    assert len(none["skipped"]) == 3 + 3 + 3 + 1  # latency, batch 1, the view's three, the compiled phase
    assert all("s of the budget left" in s["why"] for s in none["skipped"][:-1])


def test_protocol_compiled_phase(tiny_llava):
    """The compiled phase's cells (on the CPU the static path runs, `generate` does not compile), the
    plain path restored afterwards, and a budget below the compile allowance skips the phase's cells."""
    from tests.gpu_check.protocol import run_protocol

    p = run_protocol(tiny_llava, budget_s=600, repeats=1, warmup=0, batches=(1, 2), compiled=True,
                     log=lambda *_: None)
    comp = [(c["kind"], c["method"], c["batch"]) for c in p["cells"] if c.get("phase") == "compiled"]
    assert comp == [("latency", "none", 1), ("latency", "mi:lam=1", 1), ("throughput", "none", 2),
                    ("throughput", "mi:lam=1", 2)]
    assert p["skipped"] == [] and p["goals"]["mi_vs_generate_compiled"] > 0 and tiny_llava.decode_path.plain
    short = run_protocol(tiny_llava, budget_s=30, repeats=1, warmup=0, batches=(1,), compiled=True,
                         log=lambda *_: None)
    comp = [s for s in short["skipped"] if s["phase"] == "compiled"]  # at most 30 s left < the 60 s allowance
    assert [s["method"] for s in comp] == ["none", "mi:lam=1"] and "about 60 s needed" in comp[0]["why"]


@pytest.mark.parametrize("name", list(zoo.FAMILIES))
def test_each_random_builder_encodes_and_answers(name):
    fam = zoo.get_family(name)
    adapter, desc = fam.build(tiny=True, device="cpu", dtype=torch.float32, seed=0)
    assert desc.startswith("random-weight") and adapter.family == name
    for kind in fam.media:
        enc = adapter.encode(zoo.make_media(kind, True, fam.video_frames), zoo.PROMPTS[kind], need_attention=True)
        assert enc.n_visual > 0 and enc.is_video == (kind == "video")
        assert enc.attention is not None and len(enc.frames) >= (2 if kind != "image" else 1)
        full = adapter.generate(enc, None, max_new_tokens=3)
        sel = mipruner.select(adapter, enc, "random", 0.5)
        half = adapter.generate(enc, sel, max_new_tokens=3)
        assert 1 <= len(full.token_ids) <= 3 and 1 <= len(half.token_ids) <= 3
        assert sel.budget == int(0.5 * enc.n_visual + 0.5) and half.input_tokens == full.input_tokens - (
            enc.n_visual - sel.budget)


# parameters of the full-size random models, in billions: the hub checkpoints' own counts (LLaVA-1.5-7B
# 7.06, Qwen2-VL-2B 2.21, Qwen2.5-VL-3B 3.75, Qwen3-VL-2B 2.13, OneVision-qwen2-7b 8.03, InternVL3-8B 7.94; Video-LLaVA with
# Llama's default 32,000 vocabulary rows 7.37)
REAL_B = {"llava": 7.06, "llava_next": 7.06, "video_llava": 7.37, "qwen2_vl": 2.21, "qwen2_5_vl": 3.75,
          "qwen3_vl": 2.13, "llava_onevision": 8.03, "internvl": 7.94}


@pytest.mark.parametrize("name", list(REAL_B))
def test_real_shapes_build_on_the_meta_device(name):
    """The full-size configs construct (on the meta device: no memory, no weights) at the checkpoints' sizes."""
    adapter, desc = zoo.get_family(name).build(tiny=False, device="meta", dtype=torch.bfloat16, seed=0)
    n = sum(p.numel() for p in adapter.model.parameters()) / 1e9
    assert n == pytest.approx(REAL_B[name], abs=0.01) and "bfloat16" in desc
    assert all(p.dtype == torch.bfloat16 for p in adapter.model.parameters())


@pytest.mark.parametrize("name", list(REAL_B))
def test_llm_layers_shorten_only_the_llm(name):
    """--llm-layers N (the CPU proxy of a full-size run): N decoder layers, every other real shape kept."""
    build = zoo.get_family(name).build
    full, _ = build(tiny=False, device="meta", dtype=torch.bfloat16, seed=0)
    short, desc = build(tiny=False, device="meta", dtype=torch.bfloat16, seed=0, llm_layers=2)
    layers = short.model.model.language_model.layers
    depth = len(full.model.model.language_model.layers)
    assert len(layers) == 2 < depth and " 2x" in desc

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert count(full.model) - count(short.model) == (depth - 2) * count(layers[0])


def test_command_line():
    from mipruner.bench.__main__ import COMMANDS, MOVED
    from mipruner.bench.__main__ import main as bench_main

    assert "gpu-check" not in COMMANDS and bench_main(["gpu-check"]) == 2  # it left the package, and says where
    assert "tests.gpu_check run" in MOVED["gpu-check"]
    with pytest.raises(SystemExit, match="unknown family 'internvl9'"):
        gpu_check.main(["--tiny", "--families", "internvl9"])
    with pytest.raises(SystemExit, match="unknown method 'nosuch'"):
        gpu_check.main(["--tiny", "--methods", "nosuch"])
    with pytest.raises(SystemExit, match="--shares"):
        gpu_check.main(["--tiny", "--device", "cpu", "--families", "llava", "--shares", "1.5"])
    with pytest.raises(SystemExit, match="--llm-layers"):
        gpu_check.main(["--tiny", "--device", "cpu", "--families", "llava", "--llm-layers", "0"])
    with pytest.raises(ValueError, match="media must be"):
        zoo.Family("x", "X", lambda **_: None, ("audio",))
