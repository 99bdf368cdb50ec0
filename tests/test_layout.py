"""The architecture holds: imports point down the layers only, the UI reaches the library through the
model service, mipruner/ is entry modules and rooms, modules stay small, and the package installs as a wheel without the app's dependencies."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Layer of each part of the project; a module may import only from layers <= its own (docs/architecture.md
# draws it). mipruner/ is entry modules (TOP_MODULES) and folders, a folder a room (TOP_FOLDERS).
LAYERS = {
    # the floor: the one registry object, the methods on tensors, media reading, figures off a config
    "mipruner.registry": 0, "mipruner.pruners": 0, "mipruner.media": 0, "mipruner.measure": 0,
    "mipruner.models": 1, "mipruner.inllm": 2,
    "mipruner.methods": 3, "mipruner.viz": 3,  # select / answer for every stage; drawing
    # answering on a loaded model (answer_batch, the app's ModelService), plug-ins and their checks, the commands
    "mipruner.serve": 4, "mipruner.plugins": 4, "mipruner.testing": 4, "mipruner.check_pruner": 4,
    "mipruner.eval": 4, "mipruner.bench": 4, "mipruner.lmms": 4, "mipruner.shapes": 4,
    # the app: its logic without Gradio and its hosting (models, Spaces, ZeroGPU) side by side, the page above both
    "components.core": 5, "components.hosting": 5, "components.page": 6, "app": 7,
}
# mipruner/'s top level: the public front door (__init__.py) and the entry modules beside it, and the rooms.
# A new module goes into a room; a new entry module or room is added here and in docs/architecture.md.
TOP_MODULES = {"__init__.py", "methods.py", "registry.py", "media.py", "testing.py", "plugins.py", "check_pruner.py"}
TOP_FOLDERS = {"pruners", "models", "inllm", "measure", "viz", "serve", "eval", "bench", "lmms", "shapes"}
# components/ is these folders and nothing flat beside them; only the page imports gradio
APP_ROOMS = {"page": True, "core": False, "hosting": False}  # folder -> may import gradio
# What the UI may use from the library: the model service (registry specs, sessions, exports, an answer's own
# time), media and drawing (viz/), the sweeps (run on the service's model and lock), the toy model's scene and
# question generators for its examples, and the family table (data: which checkpoints to suggest). No pruner,
# model or in-LLM module.
UI_ALLOWED = ("mipruner.serve.service", "mipruner.serve.session", "mipruner.serve.export",
              "mipruner.serve.answer_time",  # what an answer of a batched call may show as its own time (no model code)
              "mipruner.models.families", "mipruner.eval.sweep", "mipruner.media", "mipruner.viz",
              "mipruner.shapes.scenes", "mipruner.shapes.questions",
              "mipruner.models.common.generation")  # the one GenerationConfig, which checks the answer length


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def sources():
    for base in ("mipruner", "components"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, base)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(dirpath, f)
    yield os.path.join(ROOT, "app.py")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def imports_of(path: str) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import in the file, relative ones resolved."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            out += [(f"{mod}.{a.name}", -node.lineno) for a in node.names]  # `from pkg import name`: maybe a module
    return out


def test_no_import_points_up_a_layer():
    bad = []
    for path in sources():
        me = module_name(path)
        if me == "mipruner":  # the package facade re-exports the front doors
            continue
        mine = layer_of(me)
        for mod, line in imports_of(path):
            line = abs(line)
            theirs = layer_of(mod)
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} ({me}, layer {mine}) imports {mod} (layer {theirs})")
    assert not bad, "\n".join(bad)


def test_ui_reads_the_library_through_the_model_service():
    bad = []
    for path in sources():
        if not module_name(path).startswith("components"):
            continue
        froms = {m for m, line in imports_of(path) if line < 0}  # `from X import a`: X itself is not used
        for mod, line in imports_of(path):
            if line > 0 and any(f.startswith(mod + ".") for f in froms):
                continue
            if (mod == "mipruner" or mod.startswith("mipruner.")) and not mod.startswith(UI_ALLOWED):
                bad.append(f"{os.path.relpath(path, ROOT)}:{abs(line)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_library_top_level_is_entry_modules_and_rooms():
    """mipruner/ holds only the entry modules (TOP_MODULES) and the room folders (TOP_FOLDERS), each a package:
    a new loose module fails here (it belongs in a room), and every room has a layer in LAYERS."""
    base = os.path.join(ROOT, "mipruner")
    modules = {f for f in os.listdir(base) if f.endswith(".py")}
    folders = {d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)) and d != "__pycache__"}
    assert modules == TOP_MODULES, f"loose modules {sorted(modules - TOP_MODULES)}, missing {sorted(TOP_MODULES - modules)}"
    assert folders == TOP_FOLDERS, f"folders {sorted(folders - TOP_FOLDERS)} not rooms, missing {sorted(TOP_FOLDERS - folders)}"
    assert all(os.path.isfile(os.path.join(base, d, "__init__.py")) for d in folders)  # no namespace package
    unlayered = [n for n in [*TOP_MODULES - {"__init__.py"}, *folders] if layer_of(f"mipruner.{n.removesuffix('.py')}") is None]
    assert not unlayered, unlayered


def test_the_app_is_in_rooms_and_only_the_page_imports_gradio():
    """components/ holds a folder per concern (APP_ROOMS: page, core, hosting) and no module beside them;
    core/ and hosting/ import no gradio (the page's handlers are Gradio's only caller of them)."""
    base = os.path.join(ROOT, "components")
    flat = sorted(f for f in os.listdir(base) if f.endswith(".py") and f != "__init__.py")
    folders = {d for d in os.listdir(base) if os.path.isfile(os.path.join(base, d, "__init__.py"))}
    assert not flat and folders == set(APP_ROOMS), (flat, sorted(folders))
    bad, pages = [], 0
    for path in sources():
        me = module_name(path)
        if not me.startswith("components."):
            continue
        room = me.split(".")[1]
        uses = any(mod == "gradio" or mod.startswith("gradio.") for mod, _ in imports_of(path))
        pages += uses
        if uses and not APP_ROOMS[room]:
            bad.append(f"{os.path.relpath(path, ROOT)} imports gradio outside components/page/")
    assert not bad, "\n".join(bad)
    assert pages > 0  # the check reads the page's imports (it would pass on a page without any)


def test_modules_stay_small():
    """No module over 380 lines unless its docstring says why it must be one ("One module: ...")."""
    big = []
    for path in sources():
        text = open(path).read()
        n = text.count("\n")
        if n > 380 and "One module:" not in (ast.get_docstring(ast.parse(text)) or ""):
            big.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not big, "\n".join(big)


def test_no_file_outside_the_repository_is_cited():
    hits = []
    docs = os.path.join(ROOT, "docs")
    pages = [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    for path in [*sources(), os.path.join(ROOT, "README.md"), *pages]:
        for i, line in enumerate(open(path), 1):
            if any(k in line for k in ("PEERS.md", "DESIGN.md", "STYLE.md", "GPU.md", "shared/paper")):
                hits.append(f"{os.path.relpath(path, ROOT)}:{i}")
    assert not hits, hits


def test_wheel_installs_the_library_without_the_app(tmp_path):
    """Build the wheel, install it (no deps) into a folder of its own and import it from there with the
    running interpreter's packages but not the checkout: the library never imports gradio, and gradio is
    only an extra. (A folder on PYTHONPATH, not a venv: a venv made from inside a venv sees the base
    interpreter's packages, not the running one's.)"""
    src, dist, target = tmp_path / "src", tmp_path / "dist", tmp_path / "target"
    # build from a copy: the checkout gets no build/ folder
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "assets", "tests", "__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(src)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next(dist.glob("mipruner-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert not any(n.startswith(("components/", "tests/", "app.py")) or "gpu_check" in n for n in names)
    assert any(n == "mipruner/shapes/train.py" for n in names) and any(n == "mipruner/inllm/fastv.py" for n in names)
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert all("extra ==" in ln for ln in requires if "gradio" in ln) and any("gradio" in ln for ln in requires)
    assert "mipruner-eval = mipruner.eval.__main__:main" in entry
    assert "[lmms_eval.models]" in entry and "mipruner = mipruner.lmms:manifest" in entry
    assert any(n.startswith("mipruner/lmms/tasks/") and n.endswith(".yaml") for n in names)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, cwd=tmp_path)
    assert (target / "mipruner" / "__init__.py").is_file() and not (target / "components").exists()
    assert not (target / "app.py").exists()

    def outside_checkout(p: str) -> bool:
        real, root = os.path.realpath(p), os.path.realpath(ROOT)
        return real != root and not real.startswith(root + os.sep)

    path = [str(target), *(p for p in sys.path if p and outside_checkout(p))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONNOUSERSITE": "1"}
    code = ("import sys, mipruner; print(mipruner.__file__); print('gradio' in sys.modules); "
            "print(len(mipruner.list_pruners()) > 5); import importlib.util as u; print(u.find_spec('components'))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env=env).stdout.split()
    assert out[0].startswith(str(target)) and out[1:] == ["False", "True", "None"]


def _models_graph() -> dict[str, set[str]]:
    """mipruner.models.* module -> the mipruner.models.* modules it imports (deferred imports too)."""
    from .test_import_cycles import import_graph

    return {m: {d for d in deps if d.startswith("mipruner.models.")}
            for m, deps in import_graph().items() if m.startswith("mipruner.models.")}


NEUTRAL = "common"  # mipruner/models/common/: the one folder of code the families share (the decoding engine too)
# The only modules flat in mipruner/models/: the package, the adapter contract users subclass
# (`mipruner.models.base.Adapter`) and the family table the UI reads (`mipruner.models.families`).
FLAT = {"__init__.py", "base.py", "families.py"}


def _folder(module: str) -> str | None:
    """The family folder of a mipruner.models module (None for the flat public modules and the neutral folder)."""
    parts = module.split(".")
    folder = parts[2] if len(parts) > 3 or (len(parts) == 3 and os.path.isdir(os.path.join(ROOT, *parts))) else None
    return None if folder == NEUTRAL else folder


def test_families_import_no_other_family_and_shared_modules_no_family():
    """A family folder imports only itself, the neutral folder common/ and the flat public modules of
    mipruner/models/; those and common/ import no family folder (no import runs back up from the shared floor).
    (InternVL and OneVision subclass common/hf_adapter.py's ProcessorAdapter, not a LLaVA module.)"""
    bad = []
    for me, deps in _models_graph().items():
        mine = _folder(me)
        for d in sorted(deps):
            theirs = _folder(d)
            if theirs is not None and theirs != mine:
                bad.append(f"{me} imports {d} (family {theirs})")
    assert not bad, "\n".join(bad)


# Shared for what they are, not for who imports them: the family table, and the test adapter (tests use it).
SHARED_BY_ROLE = ("mipruner.models.families", "mipruner.models.common.dummy", f"mipruner.models.{NEUTRAL}")


def test_flat_models_modules_are_shared():
    """mipruner/models/ holds a folder per family (or family line), the one neutral folder common/ and, flat,
    only the public modules (FLAT); common/ holds only what several families share (or what code outside
    mipruner.models uses): a shared module that one family alone reaches belongs in that family's folder."""
    from mipruner.models import FAMILIES

    from .test_import_cycles import import_graph

    graph = import_graph()
    folders = {f.folder for f in FAMILIES.values()}
    on_disk = {d for d in os.listdir(os.path.join(ROOT, "mipruner", "models"))
               if os.path.isfile(os.path.join(ROOT, "mipruner", "models", d, "__init__.py")) and d != NEUTRAL}
    assert on_disk == folders, f"family folders on disk {sorted(on_disk)} != the table's {sorted(folders)}"
    models = os.path.join(ROOT, "mipruner", "models")
    flat_files = {f for f in os.listdir(models) if f.endswith(".py")}
    assert flat_files == FLAT, f"flat modules in mipruner/models/ {sorted(flat_files)}: shared code goes in {NEUTRAL}/"
    flat = {m for m in graph if m.startswith("mipruner.models.") and _folder(m) is None}
    users: dict[str, set[str]] = {m: set() for m in flat}  # flat module -> families / "outside" reaching it
    for me, deps in graph.items():
        who = _folder(me) if me.startswith("mipruner.models.") else "outside"
        if who is None:
            continue
        stack, seen = [d for d in deps if d in flat], set()
        while stack:  # through other flat modules too
            m = stack.pop()
            if m not in seen:
                seen.add(m)
                users[m].add(who)
                stack += [d for d in graph.get(m, ()) if d in flat]
    lonely = [f"{m}: only {sorted(u) or 'nothing'}" for m, u in sorted(users.items())
              if m not in SHARED_BY_ROLE and len(u) < 2 and "outside" not in u]
    assert not lonely, "\n".join(lonely)


def test_a_module_of_the_flat_layout_says_where_it_went():
    """`import mipruner.engine` (and every module the 0.2 layout moved into a room) raises ModuleNotFoundError
    naming its new module, which imports; a name that never existed keeps Python's own sentence."""
    import importlib

    import mipruner

    for old, new in mipruner.MOVED.items():
        with pytest.raises(ModuleNotFoundError, match=f"{old} moved in mipruner 0.2: import {new.split()[0]}"):
            importlib.import_module(old)
        importlib.import_module(new.split()[0])
        assert not os.path.exists(os.path.join(ROOT, *old.split("."))) and not os.path.exists(
            os.path.join(ROOT, *old.split(".")) + ".py")
    with pytest.raises(ModuleNotFoundError, match="No module named 'mipruner.never_was'"):
        importlib.import_module("mipruner.never_was")
