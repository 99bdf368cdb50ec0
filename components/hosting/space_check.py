"""The Space check: does this repository deploy as a Hugging Face Space?

    python -m components.hosting.space_check            # the static checks, offline
    python -m components.hosting.space_check --resolve  # and resolve requirements.txt for the Space's Python (registry)

Static (no network), `problems(root)`:
  * README.md starts with the Space's front matter (YAML between --- lines) and it parses;
  * sdk is gradio and sdk_version equals the `gradio==` pin of requirements.txt (a Space installs the SDK
    version the front matter names, and then requirements.txt: two different gradios would fight);
  * python_version is a "3.N" the package admits (pyproject's requires-python);
  * app_file exists;
  * `models` (the hub ids the Space page links to) equals the app's suggested list
    (`components.hosting.hub.SUGGESTED` less the embedded model), and each hardware's default model
    (`components.hosting.space_default.HOSTED_DEFAULT`) is among them;
  * every line of requirements.txt is a requirement pip reads (`packaging.requirements.Requirement`).
`resolve(root)`: pip's resolver, run as the Space's build would but installing nothing:
`pip install --dry-run --ignore-installed --only-binary=:all: --python-version <python_version>
--platform manylinux... --target <tmp> -r requirements.txt`. It needs the package registry (wheels'
metadata only); it shows that every pin has a wheel for that Python on x86-64 Linux and that the pins
agree, not that the Space's build machine is healthy or that the GPU wheels run there.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def _read(root: str, name: str) -> str:
    with open(os.path.join(root, name), encoding="utf-8") as f:
        return f.read()


def front_matter(readme: str) -> dict:
    """The YAML between README's first two --- lines (ValueError when there is none)."""
    import yaml

    m = re.match(r"---\n(.*?)\n---\n", readme, re.S)
    if not m:
        raise ValueError("README.md does not start with the Space's front matter (a YAML block between --- lines)")
    meta = yaml.safe_load(m.group(1))
    if not isinstance(meta, dict):
        raise ValueError("the front matter is not a YAML mapping")
    return meta


def gradio_pin(requirements: str) -> str | None:
    m = re.search(r"^gradio==([^\s;#]+)", requirements, re.M)
    return m.group(1) if m else None


def problems(root: str = ROOT, readme: str | None = None, requirements: str | None = None) -> list[str]:
    """What would stop this repository from deploying as the Space it declares ([] when nothing)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet

    from .hub import EMBEDDED, SUGGESTED
    from .space_default import HOSTED_DEFAULT

    readme = _read(root, "README.md") if readme is None else readme
    requirements = _read(root, "requirements.txt") if requirements is None else requirements
    try:
        meta = front_matter(readme)
    except Exception as e:  # noqa: BLE001 - a YAML error is a problem to report
        return [str(e)]
    out = []
    if meta.get("sdk") != "gradio":
        out.append(f"front matter sdk is {meta.get('sdk')!r}, not 'gradio'")
    pin = gradio_pin(requirements)
    if pin is None:
        out.append("requirements.txt pins no gradio (gradio==X): the Space would install its SDK and then another")
    elif str(meta.get("sdk_version")) != pin:
        out.append(f"front matter sdk_version {meta.get('sdk_version')!r} differs from requirements.txt's "
                   f"gradio=={pin}")
    py = str(meta.get("python_version", ""))
    if not re.fullmatch(r"3\.\d+", py):
        out.append(f"front matter python_version {py!r} is not a Python version like '3.11'")
    else:
        m = re.search(r'requires-python\s*=\s*"([^"]+)"', _read(root, "pyproject.toml"))
        if m and not SpecifierSet(m.group(1)).contains(py + ".0"):
            out.append(f"front matter python_version {py} is outside pyproject's requires-python {m.group(1)}")
    app_file = meta.get("app_file")
    if not app_file or not os.path.isfile(os.path.join(root, str(app_file))):
        out.append(f"front matter app_file {app_file!r} is not a file of the repository")
    models = meta.get("models") or []
    suggested = [m for m in SUGGESTED if m != EMBEDDED]
    if sorted(map(str, models)) != sorted(suggested):
        missing = sorted(set(suggested) - set(map(str, models)))
        extra = sorted(set(map(str, models)) - set(suggested))
        out.append(f"front matter models differ from the app's suggested list (missing: {missing}; not suggested: "
                   f"{extra}; repeated: {len(models) != len(set(models))})")
    for kind, mid in HOSTED_DEFAULT.items():
        if mid not in suggested:
            out.append(f"the default model on {kind} hardware, {mid!r}, is not among the suggested models")
    for line in requirements.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            Requirement(line)
        except InvalidRequirement as e:
            out.append(f"requirements.txt: {line!r} is not a requirement pip reads ({e})")
    return out


def resolve(root: str = ROOT, python_version: str | None = None, timeout: int = 600) -> list[str]:
    """pip's resolution of requirements.txt for the Space's Python on x86-64 Linux, installing nothing:
    [] when every requirement resolves, else pip's last lines."""
    py = python_version or str(front_matter(_read(root, "README.md")).get("python_version"))
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", report, "--python-version", py, "--implementation", "cp", "--only-binary=:all:",
               *[a for p in PLATFORMS for a in ("--platform", p)], "--target", os.path.join(tmp, "t"),
               "-r", os.path.join(root, "requirements.txt")]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0 or not os.path.exists(report):
            tail = [ln for ln in (run.stderr + run.stdout).splitlines() if ln.startswith("ERROR")][-3:]
            return [f"requirements.txt does not resolve for Python {py}: " + " ".join(tail or ["pip failed"])]
        with open(report) as f:
            names = {i["metadata"]["name"].lower() for i in json.load(f).get("install", [])}
    missing = [n for n in ("gradio", "torch", "transformers") if n not in names]
    return [f"pip's resolution for Python {py} lacks {missing}"] if missing else []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m components.hosting.space_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--resolve", action="store_true", help="also resolve requirements.txt for the Space's Python "
                                                          "with pip --dry-run (needs the package registry)")
    a = p.parse_args(argv)
    found = problems()
    if a.resolve and not found:
        found = resolve()
    for line in found:
        print(f"space check: {line}")
    if not found:
        meta = front_matter(_read(ROOT, "README.md"))
        print(f"space check: ok (gradio {meta['sdk_version']}, Python {meta['python_version']}, "
              f"{len(meta.get('models') or [])} models{', requirements resolve' if a.resolve else ''})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
