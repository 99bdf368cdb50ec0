"""Methods from outside the package: plug-ins.

A plug-in is any importable module, or a single `.py` file, whose functions are decorated with
`mipruner.register_pruner`. It is loaded three ways:

- an installed package declares the module under the entry-point group `mipruner.pruners`
  (pyproject.toml: `[project.entry-points."mipruner.pruners"]` then `center = "my_package.center"`);
  every declared module is imported on the registry's first use (`list_pruners`, `get_pruner`,
  `prune`, `select`, the parameter list), after the built-in methods;
- the environment variable MIPRUNER_PLUGINS="mod1,mod2,/path/to/file.py", read at the same moment;
- `load_plugins("mod1,/path/to/file.py")`: what `--plugins` does on app.py, `python -m mipruner.eval`,
  `python -m mipruner.bench`, `python -m mipruner.check_pruner`, and `plugins=` in the lmms-eval
  model's model_args (there ":" separates modules, since lmms-eval splits model_args at commas).

A plug-in that fails to import, registers a name that is taken (a built-in's or another plug-in's) or
a parameter that contradicts an existing one is left out whole; a pre-LLM method that breaks the
selection contract on a quick check (`mipruner.testing.quick_failures`: shapes, duplicate or
out-of-range indices, device, determinism) is left out alone. Each case adds one plain sentence
naming the plug-in to `problems()` (the app's status line, the command lines' stderr); every other
method keeps working. `prune` and `select` check each selection a plug-in method returns as well.
`freeze()` ends loading: the app calls it once started, so no request can import code.

The loader writes the method registry only through its public operations (`METHODS.register` via
the decorator, `replace`, `unregister`, `problem`, `freeze`, `on_first_use`): the sentences and the
frozen state live in the registry object, the loader keeps only which modules it has imported.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from typing import Callable, Iterable

from .pruners import METHODS
from .registry import DuplicateNameError

GROUP = "mipruner.pruners"
ENV = "MIPRUNER_PLUGINS"
_LOADED: dict[str, str] = {}  # module (or file) -> the label of the plug-in that loaded it
_BUILTIN: set[str] = set()
_QUICK_CHECK = [True]  # check each pre-LLM method as it loads (off for `python -m mipruner.check_pruner`)


def problems() -> list[str]:
    """One sentence per plug-in (or plug-in method) left out so far, in load order."""
    return METHODS.problems()


def origin(name: str) -> str:
    """The plug-in method `name` came from ("" for a built-in)."""
    return METHODS.get(name).origin


def split_list(text: str | Iterable[str] | None) -> list[str]:
    """"a,b" or "a:b" (os.pathsep) or a list -> ["a", "b"]; blanks dropped."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    out = []
    for p in parts:
        out += [q.strip() for q in str(p).replace(os.pathsep, ",").split(",") if q.strip()]
    return out


def load_plugins(spec: str | Iterable[str] | None, *, source: str = "--plugins") -> list[str]:
    """Import the plug-in modules / `.py` files in `spec` ("mod1,mod2", "a.py:b.py" or a list);
    returns the problems this call added (each one sentence, also kept in `problems()`)."""
    if METHODS.frozen:
        raise RuntimeError(f"plug-ins can no longer be loaded: {METHODS.frozen}")
    METHODS.first_use()  # the built-ins and the installed plug-ins come first
    before = len(METHODS.problems())
    for item in split_list(spec):
        if item.endswith(".py") or os.sep in item:
            _load(f"{item!r} ({source})", item, lambda path=item: _import_file(path))
        else:
            _load(f"{item!r} ({source})", item, lambda mod=item: importlib.import_module(mod))
    return METHODS.problems()[before:]


def freeze(reason: str = "the app loads plug-ins only at start-up") -> None:
    """No further `load_plugins` nor registration (RuntimeError saying `reason`); discovery runs first
    if it has not."""
    METHODS.freeze(reason)


def take_plugins_arg(argv: list[str]) -> tuple[list[str], str | None]:
    """(`argv` without `--plugins X` / `--plugins=X`, X or None); the last one given wins."""
    rest, value, it = [], None, iter(argv)
    for a in it:
        if a == "--plugins":
            value = next(it, None)
            if value is None:
                raise SystemExit("--plugins needs a value: module names or .py files, comma-separated")
        elif a.startswith("--plugins="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
    return rest, value


def load_for_cli(spec: str | None, stream=None, *, check: bool = True) -> list[str]:
    """What the command lines do: discovery, then `spec`; every problem so far printed to `stream`
    (stderr), one line each. Returns them. check=False: no contract check as methods load (the
    checker runs them all itself)."""
    _QUICK_CHECK[0] = check
    if spec:
        load_plugins(spec)
    else:
        METHODS.first_use()
    out = problems()
    for line in out:
        print(line, file=stream or sys.stderr)
    return out


# -- loading ---------------------------------------------------------------------------------------

def _discover() -> None:
    """The registry's first use: note the built-ins, then the installed plug-ins and MIPRUNER_PLUGINS."""
    _BUILTIN.update(METHODS.current())
    for ep in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        _load(f"{ep.name!r} (entry point {ep.value})", ep.value, ep.load)
    env = os.environ.get(ENV, "")
    if env.strip():
        load_plugins(env, source=ENV)


def _import_file(path: str):
    """Import the `.py` file at `path` as module `mipruner_plugin_<stem>`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    name = "mipruner_plugin_" + "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _reason(e: BaseException) -> str:
    if isinstance(e, DuplicateNameError):
        if e.name in _BUILTIN:
            return f"it registers {e.name!r}, the name of a built-in method"
        other = METHODS.current()[e.name].origin
        return f"it registers {e.name!r}, which {'plug-in ' + other if other else 'another module'} registered already"
    text = (str(e).strip().splitlines() or [""])[0].rstrip(".")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _load(label: str, key: str, importer: Callable[[], object]) -> None:
    """Import one plug-in; on failure undo what it registered and record one sentence."""
    if key in _LOADED:
        return
    _LOADED[key] = label
    before = set(METHODS.current())
    try:
        importer()
    except Exception as e:  # a plug-in's own error of any kind: it is left out, everything else keeps working
        for name in set(METHODS.current()) - before:
            METHODS.unregister(name)
        METHODS.problem(f"Plug-in {label} was not loaded: {_reason(e)}.")
        return
    new = [n for n in METHODS.current() if n not in before]
    if not new:
        METHODS.problem(f"Plug-in {label} registered no method (decorate a function with mipruner.register_pruner).")
        return
    from .testing import quick_failures

    for name in new:
        spec = dataclasses.replace(METHODS.get(name), origin=label)
        METHODS.replace(name, spec)
        failures = quick_failures(spec.name) if spec.stage != "llm" and _QUICK_CHECK[0] else []
        if failures:
            METHODS.unregister(name)
            METHODS.problem(f"Plug-in {label}: method {name!r} was left out because it breaks the selection "
                            f"contract: {failures[0]}.")


METHODS.on_first_use(_discover)

__all__ = ["ENV", "GROUP", "freeze", "load_for_cli", "load_plugins", "origin", "problems", "split_list",
           "take_plugins_arg"]
