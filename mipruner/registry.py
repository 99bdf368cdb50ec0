"""One registry object, name -> entry, for every table of the package that code outside it extends:
the selection methods (`mipruner.pruners._registry.METHODS`) and the model families
(`mipruner.models.ADAPTERS`). The pattern of lm-eval's `lm_eval/api/registry.py` (`Registry`):
entries given directly or lazily as "module:attr" (imported on first `get`), a "did you mean"
for unknown names, `freeze()` to end registration, and nothing written from outside but through
these operations.

- `register(name, entry)`: a name taken raises `DuplicateNameError`, a frozen registry RuntimeError;
- `register_lazy(name, "pkg.module:Attr")`: imported on the first `get(name)`;
- `replace(name, entry)`, `unregister(name)`;
- `get(name)`, `names()`, `values()`, `current()` (no hooks run, nothing imported): the entries;
  `get` of an unknown name raises ValueError with "Did you mean ...? Known: ...";
- `on_first_use(hook)`: run once before the first lookup (`get`, `names`, `values`, ...), where the
  plug-in loader discovers installed plug-ins, so they load after the built-ins and only when needed;
- `freeze(reason)`: no more registrations; `frozen` says why ("" while open);
- `problem(sentence)` / `problems()`: what was left out while filling it (the plug-in loader's sentences);
- `snapshot()` / `restore(state)`: the whole state, for a test that registers and then puts it back.

An entry is any object; what it carries (a method's stage, parameters, in-LLM metadata, ...) is
its own class's business, so adding metadata to an entry needs no change here.
"""
from __future__ import annotations

import difflib
import importlib
import threading
from typing import Any, Callable, Iterator


def did_you_mean(what: str, name: Any, known: list[str]) -> ValueError:
    """ValueError "Unknown <what> (x). Did you mean ...? Known: ..." (one wording everywhere)."""
    close = difflib.get_close_matches(str(name), known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"Unknown {what} ({name!r}).{hint} Known: {', '.join(sorted(known))}")


class DuplicateNameError(ValueError):
    """A name registered a second time (`name`: which)."""

    def __init__(self, name: str, what: str = "pruner"):
        super().__init__(f"{what} {name!r} is registered twice")
        self.name = name


class Registry:
    """name -> entry (see the module docstring). `what` names an entry in messages ("pruner")."""

    def __init__(self, what: str):
        self.what = what
        self._entries: dict[str, Any] = {}  # a lazy entry is its "module:attr" string until first `get`
        self._lazy: set[str] = set()
        self._hooks: list[Callable[[], None]] = []
        self._problems: list[str] = []
        self._frozen = ""
        self._lock = threading.RLock()

    # -- filling

    def register(self, name: str, entry: Any) -> Any:
        """Add `entry` under `name`; returns it."""
        with self._lock:
            if self._frozen:
                raise RuntimeError(f"no {self.what} can be registered any more: {self._frozen}")
            if name in self._entries:
                raise DuplicateNameError(name, self.what)
            self._entries[name] = entry
        return entry

    def register_lazy(self, name: str, target: str) -> None:
        """Add `name` as "package.module:Attr", imported on its first `get`."""
        if ":" not in target:
            raise ValueError(f"a lazy {self.what} is 'module:attr', got {target!r}")
        with self._lock:
            self.register(name, target)
            self._lazy.add(name)

    def replace(self, name: str, entry: Any) -> None:
        """Put `entry` in the place of the registered `name` (e.g. the same spec with its origin noted)."""
        with self._lock:
            self.get(name)
            self._lazy.discard(name)
            self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove `name` (unknown names raise with "did you mean")."""
        with self._lock:
            self.get(name)
            self._lazy.discard(name)
            del self._entries[name]

    def on_first_use(self, hook: Callable[[], None]) -> None:
        """Run `hook()` once, before the next lookup."""
        self._hooks.append(hook)

    def first_use(self) -> None:
        """Run the pending first-use hooks now (each is taken off before it runs, so a hook that
        looks an entry up does not run itself again)."""
        while self._hooks:
            self._hooks.pop(0)()

    def freeze(self, reason: str) -> None:
        """End registration (`register` raises RuntimeError saying `reason`); first-use hooks run first."""
        self.first_use()
        self._frozen = reason

    @property
    def frozen(self) -> str:
        """Why registration ended; "" while it is open."""
        return self._frozen

    def problem(self, sentence: str) -> None:
        """Record one plain sentence about something left out."""
        self._problems.append(sentence)

    def problems(self) -> list[str]:
        """Every sentence recorded so far, in order."""
        return list(self._problems)

    # -- lookups

    def get(self, name: str) -> Any:
        """The entry `name` (a lazy one is imported now); unknown names raise with "did you mean"."""
        self.first_use()
        if not isinstance(name, str) or name not in self._entries:
            raise self.unknown(name)
        if name in self._lazy:  # the lock only around the one import: a plain lookup takes none, so
            with self._lock:    # `torch.compile(fullgraph=True)` traces through `mipruner.prune`
                if name in self._lazy:
                    module, attr = self._entries[name].split(":")
                    self._entries[name] = getattr(importlib.import_module(module), attr)
                    self._lazy.discard(name)
        return self._entries[name]

    def unknown(self, name: Any) -> ValueError:
        """The error for an unknown `name`: "Unknown <what> (name). Did you mean ...? Known: ..."."""
        return did_you_mean(self.what, name, list(self._entries))

    def current(self) -> dict[str, Any]:
        """What is registered right now, without running first-use hooks or importing lazy entries
        (those show as their "module:attr"): for code that runs while the registry is being filled."""
        with self._lock:
            return dict(self._entries)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        self.first_use()
        return list(self._entries)

    def values(self) -> list[Any]:
        """Every entry, in registration order (lazy ones are imported)."""
        return [self.get(n) for n in self.names()]

    def __contains__(self, name: object) -> bool:
        self.first_use()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    # -- state as a whole

    def snapshot(self) -> tuple:
        with self._lock:
            return dict(self._entries), set(self._lazy), list(self._hooks), list(self._problems), self._frozen

    def restore(self, state: tuple) -> None:
        with self._lock:
            entries, lazy, hooks, problems, frozen = state
            self._entries, self._lazy, self._hooks = dict(entries), set(lazy), list(hooks)
            self._problems, self._frozen = list(problems), frozen


__all__ = ["DuplicateNameError", "Registry", "did_you_mean"]
