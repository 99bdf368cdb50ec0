"""The docs hold: README.md stays a short front door with the Space's front matter, every relative link of
README.md and docs/*.md reaches a file (and a heading), the README's test command is the one CI runs, and
every Python snippet marked `<!-- runnable -->` runs offline as written (the convention: docs/architecture.md,
"Runnable snippets in the docs")."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README, *sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
RUNNABLE = re.compile(r"^<!-- runnable -->[ \t]*\n```python\n(.*?)^```", re.S | re.M)


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose(text: str) -> str:
    """The text without fenced blocks and inline code spans (links and headings there are not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation other than '-' and '_' dropped, spaces to '-',
    a repeated id numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(text: str) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(text))


def snippets() -> list[tuple[str, int, str]]:
    return [(rel(p), i, code) for p in PAGES for i, code in enumerate(RUNNABLE.findall(read(p)))]


def test_readme_is_a_front_door_with_the_space_front_matter():
    text = read(README)
    assert text.count("\n") <= 300, f"README.md has {text.count(chr(10))} lines: move the detail into docs/"
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, "README.md must start with the Hugging Face Space front matter (a --- YAML block)"
    meta = dict(ln.split(":", 1) for ln in m.group(1).splitlines() if ":" in ln and not ln.startswith(" "))
    meta = {k.strip(): v.strip().strip('"') for k, v in meta.items()}
    assert meta.get("sdk") == "gradio" and meta.get("app_file") == "app.py", meta
    pin = re.search(r"^gradio==(\S+)", read(os.path.join(ROOT, "requirements.txt")), re.M).group(1)
    assert meta.get("sdk_version") == pin, f"front matter sdk_version {meta.get('sdk_version')} != gradio=={pin}"


def test_the_readme_test_command_is_the_one_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)```", read(README), re.S)
    readme = next(b for b in blocks if "pytest" in b).strip()
    ci = read(os.path.join(ROOT, ".ci", "run")).split("# The README's test command", 1)[1].split("\n", 1)[1]
    ci = ci.split("\n# After the README's command", 1)[0]  # CI's own extra run (docs/architecture.md#exactness)
    ci = ci.replace("pip install -q ", "pip install ").strip()

    def steps(cmd: str) -> list[str]:
        return [s.strip() for s in re.split(r"&&|\n", cmd) if s.strip()]

    assert steps(readme) == steps(ci)


def test_ci_runs_pytest_in_a_new_temp_folder_as_a_fresh_machine_does():
    """Every pytest run of .ci/run gets a new --basetemp inside a new `mktemp -d` folder, named like a fresh
    machine's first runs (pytest-0, pytest-1): a test that depends on the temp folder's name fails on CI too."""
    ci = read(os.path.join(ROOT, ".ci", "run"))
    lines = [ln.strip() for ln in ci.splitlines() if not ln.lstrip().startswith("#")]
    made = [ln for ln in lines if re.match(r'CI_TMP="\$\(mktemp -d\)"$', ln)]
    opts = [ln for ln in lines if ln.startswith("export PYTEST_ADDOPTS=")]
    runs = [i for i, ln in enumerate(lines) if "python3 -m pytest" in ln]
    assert made and len(opts) == len(runs) >= 2, (made, opts, runs)
    for n, (opt, run) in enumerate(zip(opts, runs)):
        assert opt.endswith(f'--basetemp=$CI_TMP/pytest-of-$(id -un)/pytest-{n}"'), opt
        assert lines.index(opt) < run and all(not (lines.index(opt) < i < run) or i == run for i in runs), opt


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_reach_a_file_and_a_heading(page):
    bad = []
    for target in links(read(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(dest):
            bad.append(f"{target}: no file {rel(dest)}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(read(dest)):
            bad.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not bad, f"{rel(page)}: " + "; ".join(bad)


def test_the_anchor_rule_follows_github():
    text = "# The embedded model's curves\n```\n# not a heading\n```\n## In-LLM: FastV, DART\n## Tests\n## Tests\n"
    assert anchors(text) == {"the-embedded-models-curves", "in-llm-fastv-dart", "tests", "tests-1"}
    assert links("[a](b.md#c) `[x](nope.md)` ![i](../p.png)\n```\n[y](nope2.md)\n```") == ["b.md#c", "../p.png"]


def test_the_readme_has_a_runnable_example():
    assert any(page == "README.md" for page, _, _ in snippets())


@pytest.mark.parametrize("page,index,code", snippets(), ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_runnable_snippet_runs_offline(page, index, code):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{page}, runnable snippet {index + 1}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def test_the_family_tables_are_the_family_table():
    """README's "Model families" table, its Space front matter's models and docs/models.md name the rows of
    `mipruner.models.FAMILIES` (the one list): every model_type, no other, and checkpoints it suggests."""
    from mipruner.models import FAMILIES

    text = read(README)
    section = text.split("\n## Model families", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in section.splitlines()
            if r.startswith("| ") and not r.startswith("| family")]
    assert rows, "README.md has no family table under '## Model families'"
    types = {t for r in rows for t in re.findall(r"`([^`]+)`", r[1])}
    assert types == set(FAMILIES), f"README's model_type column {sorted(types)} != the table's {sorted(FAMILIES)}"
    suggested = {m for f in FAMILIES.values() for m in f.suggested}
    examples = {m for r in rows if "shapes-llava" not in r[2] for m in re.findall(r"`([^`]+)`", r[2])}
    assert examples <= suggested, sorted(examples - suggested)
    front = re.search(r"^models:\n((?:  - .+\n)+)", text, re.M)
    assert front and {m[4:] for m in front.group(1).splitlines()} <= suggested
    models_md = read(os.path.join(ROOT, "docs", "models.md"))
    assert not [f for f in FAMILIES if f"`{f}`" not in models_md]
