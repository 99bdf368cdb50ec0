"""The hosted demo: the Space check (front matter, requirements), the model a Space starts on for its
hardware, the app started as a Space with no hub reachable (through gradio_client), and the commands of
docs/space.md marked `<!-- runnable -->`."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import pytest

from components.hosting import space_check
from components.hosting.hub import EMBEDDED, SUGGESTED
from components.hosting.space_default import HARDWARE_NOTE, HOSTED_DEFAULT, hardware, start_model

from .conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_DEFAULT = HOSTED_DEFAULT["cpu"]
FALLBACK = (f"Could not load {CPU_DEFAULT!r}, this Space's default on a CPU, because its files are not on this "
            f"machine and the model hub cannot be reached, so the embedded model 'shapes-llava' serves instead.")


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


# -- the Space check ---------------------------------------------------------------------------

def test_the_repository_passes_the_space_check():
    assert space_check.problems() == []
    meta = space_check.front_matter(read("README.md"))
    assert meta["sdk_version"] == space_check.gradio_pin(read("requirements.txt"))
    assert sorted(meta["models"]) == sorted(m for m in SUGGESTED if m != EMBEDDED)


def test_the_check_fails_when_sdk_version_differs_from_the_gradio_pin():
    readme, reqs = read("README.md"), read("requirements.txt")
    pin = space_check.gradio_pin(reqs)
    other = re.sub(r"^sdk_version: .*$", "sdk_version: 5.0.0", readme, count=1, flags=re.M)
    assert other != readme
    found = space_check.problems(readme=other, requirements=reqs)
    assert found == [f"front matter sdk_version '5.0.0' differs from requirements.txt's gradio=={pin}"]
    # and the other way round: the pin moves, the front matter stays
    found = space_check.problems(readme=readme, requirements=reqs.replace(f"gradio=={pin}", "gradio==5.0.0"))
    assert found == [f"front matter sdk_version {pin!r} differs from requirements.txt's gradio==5.0.0"]


def test_the_check_reads_every_field_it_names():
    readme, reqs = read("README.md"), read("requirements.txt")
    cases = {
        "  - Qwen/Qwen3-VL-2B-Instruct\n": ("", "front matter models differ from the app's suggested list"),
        'python_version: "3.11"': ('python_version: "3.9"', "outside pyproject's requires-python"),
        "app_file: app.py": ("app_file: main.py", "app_file 'main.py' is not a file"),
        "sdk: gradio": ("sdk: docker", "sdk is 'docker'"),
    }
    for old, (new, expected) in cases.items():
        assert old in readme, old
        found = space_check.problems(readme=readme.replace(old, new, 1), requirements=reqs)
        assert len(found) == 1 and expected in found[0], (old, found)
    assert space_check.problems(readme="# no front matter\n", requirements=reqs)[0].startswith("README.md does not")
    assert "not a requirement pip reads" in space_check.problems(readme=readme, requirements=reqs + "torch=>2\n")[0]


def test_requirements_resolve_for_the_space_python():
    """pip's resolver (registry metadata; nothing installed) finds a wheel of every pin for the front
    matter's Python on x86-64 Linux."""
    assert space_check.resolve() == []


# -- the model a Space starts on ---------------------------------------------------------------

def test_the_hardware_and_the_start_model_come_from_the_environment():
    assert hardware({"SPACES_ZERO_GPU": "true"}, cuda=False) == "zero-gpu"
    assert hardware({}, cuda=True) == "gpu" and hardware({"SPACES_ZERO_GPU": "false"}, cuda=False) == "cpu"
    space = {"SPACE_ID": "someone/mipruner"}
    assert start_model({}, cuda=True) == (EMBEDDED, "")  # locally: the embedded model, whatever the GPU
    assert start_model(space, cuda=False) == (CPU_DEFAULT, "this Space's default on a CPU")
    assert start_model(space, cuda=True) == (HOSTED_DEFAULT["gpu"], "this Space's default on a GPU")
    assert start_model({**space, "SPACES_ZERO_GPU": "true"})[0] == HOSTED_DEFAULT["zero-gpu"]
    assert start_model({**space, "MIPRUNER_MODEL": "llava-hf/llava-1.5-7b-hf"}, cuda=False) == (
        "llava-hf/llava-1.5-7b-hf", "")
    assert set(HOSTED_DEFAULT) == set(HARDWARE_NOTE) and HARDWARE_NOTE["cpu"].endswith("press Generate answers.")


def test_the_defaults_are_suggested_models_of_the_sizes_asked():
    """GPU: a 2-3 B model; CPU: under 1 B (parameters counted on the meta device, as the GPU check does)."""
    from mipruner.bench.space_cost import count_params

    assert all(m in SUGGESTED for m in HOSTED_DEFAULT.values())
    assert 2e9 <= count_params(HOSTED_DEFAULT["gpu"]) <= 3e9
    assert 2e9 <= count_params(HOSTED_DEFAULT["zero-gpu"]) <= 3e9
    assert count_params(CPU_DEFAULT) < 1e9


def test_the_onevision_half_billion_shape():
    """llava-onevision-qwen2-0.5b-ov-hf as transformers' conversion script builds it: SigLIP-so400m (26 layers)
    and Qwen2-0.5B-Instruct (24 x 896, tied embeddings), 151,936 + 2 rows padded to 64."""
    import torch

    from mipruner.models.onevision.random_weights import build

    ad, desc = build(tiny=False, device="meta", dtype=torch.bfloat16, shape="0.5B")
    t = ad.model.config.text_config
    assert (t.num_hidden_layers, t.hidden_size, t.intermediate_size, t.vocab_size) == (24, 896, 4864, 152000)
    assert ad.model.lm_head.weight is ad.model.model.language_model.embed_tokens.weight
    assert sum(p.numel() for p in ad.model.parameters()) == pytest.approx(0.894e9, abs=1e6)
    assert "Qwen2 24x896" in desc and "SigLIP 26x1152" in desc
    with pytest.raises(ValueError, match="shape must be one of"):
        build(tiny=False, device="meta", dtype=torch.bfloat16, shape="3B")


def test_the_memory_table_says_what_fits():
    from mipruner.bench.space_cost import cpu_fit, fits

    assert [fits(w, 16) for w in (13.6, 14.1, 16.0, 16.1)] == ["yes", "tight", "tight", "no"]
    assert cpu_fit(1.8, 3.6, 16) == "yes (fp32)" and cpu_fit(7.5, 15.0, 16) == "bf16"
    assert cpu_fit(14.1, 28.3, 16) == "bf16, tight" and cpu_fit(16.1, 32.1, 16) == "no"


def test_parse_args_starts_locally_on_the_embedded_model_and_on_a_space_on_its_default(monkeypatch):
    import app

    for var in ("SPACE_ID", "MIPRUNER_MODEL", "SPACES_ZERO_GPU"):
        monkeypatch.delenv(var, raising=False)
    args = app.parse_args([])
    assert (args.model, args.model_role) == (EMBEDDED, "")
    monkeypatch.setenv("SPACE_ID", "someone/mipruner")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = app.parse_args([])
    assert (args.model, args.model_role) == (CPU_DEFAULT, "this Space's default on a CPU")
    assert app.parse_args(["--model", "shapes-llava"]).model_role == ""
    assert CPU_DEFAULT in app.model_policy(args).allow  # hosted: the suggested models, the default among them
    # a CPU Space loads fp32: visitors' checkpoints are capped at 5 GB unless the owner says otherwise
    assert args.max_model_gb == 5.0 and app.model_policy(args).max_bytes == 5 * 10**9
    monkeypatch.setenv("MIPRUNER_MAX_MODEL_GB", "12")
    assert app.parse_args([]).max_model_gb == 12.0 and app.parse_args(["--max-model-gb", "0"]).max_model_gb == 0
    monkeypatch.delenv("MIPRUNER_MAX_MODEL_GB")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert app.parse_args([]).max_model_gb == 30.0  # a GPU Space: the app's default
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert app.parse_args([]).max_model_gb == 30.0  # locally too


def test_the_caps_a_space_owner_sets_are_environment_variables(monkeypatch):
    import app

    for var, value in {"MIPRUNER_CACHE_MB": "256", "MIPRUNER_FILES_MB": "128", "MIPRUNER_MAX_SESSIONS": "50",
                       "MIPRUNER_MAX_NEW_TOKENS": "16", "MIPRUNER_MAX_FILE_SIZE": "10mb", "MIPRUNER_DTYPE": "bf16",
                       "MIPRUNER_MODEL": EMBEDDED}.items():
        monkeypatch.setenv(var, value)
    a = app.parse_args([])
    assert (a.cache_mb, a.files_mb, a.max_sessions, a.max_new_tokens, a.max_file_size, a.dtype) == (
        256, 128, 50, 16, "10mb", "bf16")
    assert app.parse_args(["--cache-mb", "64"]).cache_mb == 64  # a flag still wins
    monkeypatch.setenv("MIPRUNER_DTYPE", "fp8")
    with pytest.raises(SystemExit):
        app.parse_args([])


def test_a_space_serving_a_real_model_says_why_answers_wait(monkeypatch):
    import app

    class Hub:
        fallback = EMBEDDED

    real, toy = Hub(), Hub()
    real.default, toy.default = CPU_DEFAULT, EMBEDDED
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert app.hardware_note(real) == ""  # locally: nothing to explain
    monkeypatch.setenv("SPACE_ID", "someone/mipruner")
    assert app.hardware_note(real) == HARDWARE_NOTE["cpu"] and app.hardware_note(toy) == ""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert app.hardware_note(real) == HARDWARE_NOTE["zero-gpu"]


# -- the app started as a Space with no hub ----------------------------------------------------

def start_space(tmp_path_factory, **extra):
    """app.py as a CPU Space starts it: SPACE_ID set, no GPU, the hub unreachable (HF_HUB_OFFLINE) and an
    empty hub cache; `extra`: more environment. Returns (process, url, log path) once it serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MIPRUNER_MODEL", "SPACES_ZERO_GPU", "SYSTEM")}
    env.update(SPACE_ID="someone/mipruner", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               HF_HOME=str(tmp_path_factory.mktemp("hf-home")), OMP_NUM_THREADS="1", **extra)
    log = tmp_path_factory.mktemp("space-log") / "app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"app.py did not start as a Space:\n{log.read_text()[-3000:]}")
            time.sleep(1)
    return proc, url, log


def page_props(url) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    return {c["props"].get("elem_id"): c["props"] for c in client.config["components"] if "props" in c}


@pytest.fixture(scope="module")
def space_app(tmp_path_factory):
    """No MIPRUNER_MODEL and no hub: the CPU default cannot be loaded."""
    proc, url, log = start_space(tmp_path_factory)
    yield url, log
    proc.terminate()
    proc.wait(30)


def test_a_space_without_a_hub_serves_the_embedded_model_and_says_why(space_app):
    from gradio_client import Client, handle_file

    from components.core.examples import load_examples
    from components.core.settings import Settings
    from components.page.controls import control_values

    url, log = space_app
    client = Client(url, verbose=False)
    props = page_props(url)
    assert props["model-status"]["value"] == FALLBACK  # the page's status line: one sentence
    assert props["model"]["value"] == EMBEDDED and props["auto-answers"]["value"] is True  # the toy answers fast
    example = next(e for e in load_examples() if e["kind"] == "image")
    status, *_ = client.predict(EMBEDDED, "", "image", handle_file(example["path"]), None, example["prompt"],
                                *control_values(Settings(), 196), api_name="/encode")
    assert status.startswith("**shapes-llava**: 1 image -> 196 visual tokens") and status.endswith(" " + FALLBACK)
    assert FALLBACK in log.read_text()  # and the Space's log


def test_a_cpu_space_on_a_real_model_does_not_answer_by_itself_and_says_why(tmp_path_factory):
    """The owner's model (here a tiny OneVision checkpoint in a local folder) loads: answers wait for
    Generate, and the status line says why."""
    from tests.models.tiny_onevision import save_tiny

    path = save_tiny(str(tmp_path_factory.mktemp("owner") / "tiny-onevision"))
    proc, url, _ = start_space(tmp_path_factory, MIPRUNER_MODEL=path)
    try:
        props = page_props(url)
    finally:
        proc.terminate()
        proc.wait(30)
    assert props["model-status"]["value"] == f"Model {path!r} loaded. {HARDWARE_NOTE['cpu']}"
    assert props["model"]["value"] == path and props["auto-answers"]["value"] is False
    assert props["fewer-views"]["value"] is True and props["fewer-views"]["visible"] is not False  # a CPU: 1 view


# -- docs/space.md's commands ------------------------------------------------------------------

def runnable_commands() -> list[str]:
    text = read(os.path.join("docs", "space.md"))
    blocks = re.findall(r"^<!-- runnable -->[ \t]*\n```bash\n(.*?)^```", text, re.S | re.M)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_docs_space_has_runnable_commands():
    cmds = runnable_commands()
    assert any("components.hosting.space_check" in c for c in cmds) and any("space-cost" in c for c in cmds)


@pytest.mark.parametrize("cmd", runnable_commands())
def test_docs_space_command_runs_offline(cmd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = shlex.split(cmd)
    assert argv[0] == "python", cmd
    run = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{cmd}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    if "--params" in argv:  # the page's memory table is this command's output
        rows = [ln for ln in run.stdout.splitlines() if ln.startswith("| `")]
        assert len(rows) == len(SUGGESTED) - 1
        page = read(os.path.join("docs", "space.md"))
        assert [r for r in rows if r not in page] == []
