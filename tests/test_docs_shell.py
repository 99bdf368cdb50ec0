"""Every shell block of README.md and docs/*.md marked `<!-- runnable -->` (commands that run offline in
seconds) runs as written, as a new user runs it: from the root of a copy of the repository, with `python`
and `pip` those of a fresh venv that sees the tested environment's packages (a .pth file), offline (pip
reads PIP_NO_INDEX and PIP_NO_BUILD_ISOLATION from the environment: the text of the commands is not
changed). What the commands write must land in ignored folders (.gitignore), never untracked in the
repository."""
from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys

import pytest

from .test_docs import PAGES, read, rel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNABLE_SH = re.compile(r"^<!-- runnable -->[ \t]*\n```(?:bash|sh)\n(.*?)^```", re.S | re.M)
SKIP = shutil.ignore_patterns(".git", "__pycache__", "build", "*.egg-info", "outputs", "runs", ".pytest_cache")


def blocks() -> list[tuple[str, int, str]]:
    return [(rel(p), i, code) for p in PAGES for i, code in enumerate(RUNNABLE_SH.findall(read(p)))]


def outside_checkout(p: str) -> bool:
    real, root = os.path.realpath(p), os.path.realpath(ROOT)
    return real != root and not real.startswith(root + os.sep)


def fresh_venv(where) -> str:
    """A venv without pip of its own that sees the running interpreter's packages; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    purelib = subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    seen = [p for p in [*site.getsitepackages(), *sys.path] if p and os.path.isdir(p) and outside_checkout(p)]
    with open(os.path.join(purelib, "tested-environment.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(seen)) + "\n")
    pip = where / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    return str(where / "bin")


def files_under(top: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs}


def test_there_are_runnable_shell_blocks():
    assert {page for page, _, _ in blocks()} >= {"docs/plugins.md", "docs/benchmarks.md"}


@pytest.mark.parametrize("page,index,code", blocks(), ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_runnable_shell_block_runs_offline(page, index, code, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=SKIP)
    before = files_under(str(repo))
    bin_dir = fresh_venv(tmp_path / "venv")
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "PIP_NO_INDEX": "1",
           "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONNOUSERSITE": "1"}
    for name in ("PYTHONPATH", "MIPRUNER_PLUGINS", "VIRTUAL_ENV"):
        env.pop(name, None)
    run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"{page}, runnable shell block {index + 1}:\n{run.stdout[-3000:]}\n{run.stderr[-4000:]}"
    new = sorted(files_under(str(repo)) - before)
    if new:  # what the commands wrote must be ignored by the repository's .gitignore
        check = subprocess.run(["git", "-C", ROOT, "check-ignore", "--no-index", "--verbose", "--non-matching", "--stdin"],
                               input="\n".join(new), capture_output=True, text=True)
        untracked = [ln.split("\t", 1)[1] for ln in check.stdout.splitlines() if ln.startswith("::")]
        assert not untracked, f"{page}, block {index + 1} leaves untracked files in the repository: {untracked[:10]}"
