"""The lock holds: every requirement of the requirements files and of pyproject.toml has exactly one
`==` pin in requirements.lock that satisfies it; the README's two commands and .ci/run install through
files that apply the lock (`-c requirements.lock`); and on CI (MIPRUNER_CHECK_LOCKED=1, set by .ci/run)
the installed environment is the lock's, so a new upstream release cannot enter by surprise."""
from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements.lock")
REQUIREMENT_FILES = ["requirements.txt", "requirements-dev.txt", "requirements-lmms.txt"]


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def lock_pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in read("requirements.lock").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([0-9][^\s;]*)", line)
        assert m, f"requirements.lock: {line!r} is not a plain name==version pin"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"requirements.lock pins {name} twice"
        pins[name] = Version(m.group(2))
    return pins


def file_requirements(name: str) -> list[Requirement]:
    """The requirements a file names, following -r includes (-c lines are the lock itself)."""
    out = []
    for line in read(name).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-c"):
            continue
        if line.startswith("-r"):
            out += file_requirements(line[2:].strip())
            continue
        out.append(Requirement(line))
    return out


def applies_lock(name: str) -> bool:
    """Whether installing from this file is constrained by the lock (directly or through an -r include)."""
    lines = [ln.split("#", 1)[0].strip() for ln in read(name).splitlines()]
    if "-c requirements.lock" in lines:
        return True
    return any(ln.startswith("-r") and applies_lock(ln[2:].strip()) for ln in lines)


def pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads(read("pyproject.toml"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def install_commands() -> list[str]:
    """The README's two Quick-start commands and .ci/run's install line."""
    blocks = re.findall(r"```bash\n(.*?)```", read("README.md").split("## Quick start", 1)[1], re.S)[:2]
    ci = [ln for ln in read(".ci/run").splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]
    return [b.strip() for b in blocks] + ci


def test_the_lock_is_plain_pins_without_duplicates():
    pins = lock_pins()
    assert len(pins) > 50, "the lock should hold the transitive environment, not only the direct requirements"
    for name in ("torch", "transformers", "gradio", "filelock", "lmms-eval", "pytest"):
        assert name in pins, f"requirements.lock does not pin {name}"


@pytest.mark.parametrize("source", [*REQUIREMENT_FILES, "pyproject.toml"])
def test_every_requirement_is_pinned_by_the_lock_and_the_pin_satisfies_it(source):
    pins = lock_pins()
    reqs = pyproject_requirements() if source == "pyproject.toml" else file_requirements(source)
    bad = []
    for req in reqs:
        name = canonicalize_name(req.name)
        if name == "mipruner":
            continue
        if name not in pins:
            bad.append(f"{req} is not in requirements.lock")
        elif not req.specifier.contains(pins[name], prereleases=True):
            bad.append(f"{req} is not satisfied by the lock's {name}=={pins[name]}")
    assert not bad, f"{source}: " + "; ".join(bad)


@pytest.mark.parametrize("name", REQUIREMENT_FILES)
def test_every_requirements_file_applies_the_lock(name):
    assert applies_lock(name), f"{name} neither has '-c requirements.lock' nor includes a file that has it"


def test_the_readme_commands_and_ci_install_from_the_lock():
    commands = install_commands()
    assert len(commands) == 3, commands
    for command in commands:
        for step in re.split(r"&&|\n", command):
            if "pip install" not in step:
                continue
            files = re.findall(r"-r\s+(\S+)", step)
            locked = "-c requirements.lock" in step or (files and all(applies_lock(f) for f in files))
            assert locked, f"this install step does not use the lock: {step.strip()}"
            for spec in re.findall(r"\s([A-Za-z0-9_.\-]+(?:==|>=|<=|~=|>|<)[^\s]+)", step):
                req = Requirement(spec)
                assert str(req.specifier).startswith("=="), f"{spec}: a package named on a command line is pinned exactly"
                assert req.specifier.contains(lock_pins()[canonicalize_name(req.name)]), f"{spec} differs from the lock"


def test_the_relock_command_is_documented():
    assert os.access(os.path.join(ROOT, ".ci", "relock"), os.X_OK), ".ci/relock must be executable"
    assert "bash .ci/relock" in read("docs/architecture.md")


@pytest.mark.skipif(os.environ.get("MIPRUNER_CHECK_LOCKED") != "1",
                    reason="compares the installed environment with the lock; .ci/run sets MIPRUNER_CHECK_LOCKED=1")
def test_the_installed_environment_is_the_locks():
    differ = []
    for name, version in lock_pins().items():
        try:
            have = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            differ.append(f"{name} missing (lock {version})")
            continue
        if (have if version.local else Version(have.public)) != version:  # torch 2.13.0+cpu is the lock's 2.13.0
            differ.append(f"{name} {have} (lock {version})")
    assert not differ, "installed packages differ from requirements.lock: " + ", ".join(differ)
