"""The docs that list the registered methods list them all: library.md's printed `list_pruners()` is the
built-ins' list, and methods.md's in-LLM section names every in-LLM built-in in its heading and its text."""
from __future__ import annotations

import ast
import os
import re

import mipruner

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def builtins(stage: str | None = None) -> list[str]:
    return [n for n in mipruner.list_pruners(stage) if mipruner.get_pruner(n).builtin]


def test_librarys_list_pruners_output_is_the_registry():
    text = open(os.path.join(DOCS, "library.md")).read()
    call = text.index("mipruner.list_pruners()")
    printed = re.search(r"\n# (\[.*\])\n", text[call:]).group(1)
    assert ast.literal_eval(printed) == builtins()


def test_the_in_llm_section_names_every_in_llm_method():
    text = open(os.path.join(DOCS, "methods.md")).read()
    head = re.search(r"^## In-LLM.*$", text, re.M)
    body = text[head.end():text.index("\n## ", head.end())]
    first = body.strip().split("\n\n")[0]  # the section's first paragraph
    for name in builtins("llm"):
        label = mipruner.get_pruner(name).label
        assert label in head.group(0) and label in first.split(". ")[0], (name, head.group(0), first[:80])
