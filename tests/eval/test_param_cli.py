"""A method parameter as the command lines and the app's API show it: a `%` in its doc prints in
`python -m mipruner.eval --help` (argparse formats help with %), and an integer Param is an integer
in the app's API (a slider or a number box alike)."""
from __future__ import annotations

import pytest

from mipruner import Param, Selection, register_pruner
from mipruner.pruners import unregister_pruner


@pytest.fixture
def percent_method():
    @register_pruner("pct_doc_test", params=(Param.integer("pct_keep", 25, 1, 100, "share kept, in % (25% = a quarter)"),
                                              Param.integer("pct_free", 3, 1, None, "an unbounded integer")))
    def pct_doc_test(visual, text, budget, *, pct_keep=25, pct_free=3):
        """A method whose parameter doc holds %."""
        import torch

        return Selection.from_order(torch.arange(budget, device=visual.device),
                                    torch.zeros(visual.shape[0], device=visual.device))

    yield "pct_doc_test"
    unregister_pruner("pct_doc_test")


def test_percent_in_a_param_doc_prints_in_help(percent_method, capsys):
    from mipruner.eval.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "share kept, in % (25% = a quarter)" in " ".join(capsys.readouterr().out.split())


def test_integer_params_are_integers_in_the_apps_api(percent_method):
    pytest.importorskip("gradio")
    from components.page.controls import param_widget
    from mipruner.pruners import get_pruner

    spec = get_pruner(percent_method)
    for name in ("pct_keep", "pct_free"):  # a slider (bounded) and a number box (unbounded)
        widget = param_widget(spec.param(name))
        assert widget.api_info()["type"] == "integer"
        assert widget.preprocess(7.0) == 7 and isinstance(widget.preprocess(7.0), int)
    assert param_widget(get_pruner("mi").param("lam")).api_info()["type"] == "number"
