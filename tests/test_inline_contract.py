"""A method registered inline (in a script, a notebook, a test) is held to the selection contract exactly as
the same code loaded as a plug-in (`--plugins`): a fixed-K method keeping 7 of 8 tokens is refused by
`select` / `prune` in both cases, with one failure sentence naming who registered it. mipruner's own
methods are the only ones not checked at run time (they are tested instead)."""
from __future__ import annotations

import textwrap

import pytest
import torch

import mipruner
from mipruner import plugins as P
from mipruner.pruners._registry import ContractError
from mipruner.testing import embedded_encoding

from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from .plugin_registry import registry_restored

SOURCE = '''
import torch
from mipruner import Selection, register_pruner
from mipruner.inllm import register_inllm


@register_pruner("short_pre_{tag}")
def short_pre(visual, text, budget):
    """Keeps one token fewer than the budget (a fixed-K method that does not keep K)."""
    scores = visual.norm(dim=1)
    return Selection.from_order(torch.argsort(scores, descending=True)[:budget - 1], scores)


@register_inllm("short_llm_{tag}")
def short_llm(run, budget):
    """At layer 1, keeps one token fewer than the budget."""
    view = run.at(1)
    order = torch.arange(budget - 1, device=view.visual.device)
    run.keep(view, order)
    return Selection.from_order(order, torch.zeros(run.n_visual, device=order.device))
'''


@pytest.fixture(scope="module")
def model():
    return embedded_encoding()


def failures(ad, enc, tag: str) -> list[str]:
    out = []
    for name in (f"short_pre_{tag}", f"short_llm_{tag}"):
        with pytest.raises(ContractError) as err:
            mipruner.select(ad, enc, name, 8)
        out.append(err.value.failure)
        assert "broke the selection contract" in str(err.value)
    with pytest.raises(ContractError):
        mipruner.prune(f"short_pre_{tag}", visual=enc.visual, budget=8)
    return out


def test_inline_and_plugin_methods_are_checked_alike(model, tmp_path):
    ad, enc = model
    with registry_restored(tmp_path):
        exec(compile(textwrap.dedent(SOURCE.format(tag="inline")), "<script>", "exec"), {"__name__": "__main__"})
        spec = mipruner.get_pruner("short_pre_inline")
        assert spec.checked and not spec.builtin and spec.origin == "" and spec.source == "module __main__"
        inline = failures(ad, enc, "inline")
        with pytest.raises(ContractError, match=r"'short_llm_inline', a method of module __main__, broke"):
            mipruner.select(ad, enc, "short_llm_inline", 8)
        path = tmp_path / "short_plugin.py"
        path.write_text(textwrap.dedent(SOURCE.format(tag="plugin")))
        P._QUICK_CHECK[0] = False  # the loader's own check would leave the pre-LLM one out at load
        assert P.load_plugins(str(path)) == [], P.problems()
        assert mipruner.get_pruner("short_pre_plugin").checked
        plugin = failures(ad, enc, "plugin")
    assert inline == plugin  # the same sentence either way
    assert inline[0].startswith("keep has shape (7,) for a budget of 8 tokens"), inline


def test_mipruners_own_methods_are_the_builtins():
    for name in mipruner.list_pruners():
        spec = mipruner.get_pruner(name)
        assert spec.builtin == (not spec.origin) and spec.checked == bool(spec.origin), name
