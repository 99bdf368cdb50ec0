"""The registry object (`mipruner.registry.Registry`) that holds the methods and the model families:
lazy "module:attr" entries imported on first use, one "did you mean", duplicates refused, first-use
hooks run once, `freeze` ending registration, the problems it was told, and a snapshot to restore."""
from __future__ import annotations

import pytest

from mipruner.models import ADAPTERS, FAMILIES, adapter_class
from mipruner.pruners._registry import METHODS
from mipruner.registry import DuplicateNameError, Registry


def test_lazy_entries_are_imported_on_first_get_only():
    r = Registry("widget")
    r.register_lazy("dec", "decimal:Decimal")
    assert r.current()["dec"] == "decimal:Decimal" and "dec" in r
    import decimal

    assert r.get("dec") is decimal.Decimal and r.current()["dec"] is decimal.Decimal
    with pytest.raises(ValueError, match="module:attr"):
        r.register_lazy("bad", "decimal.Decimal")


def test_unknown_names_duplicates_and_freeze():
    r = Registry("widget")
    r.register("alpha", 1)
    with pytest.raises(ValueError, match=r"Unknown widget \('alpah'\)\. Did you mean 'alpha'\? Known: alpha"):
        r.get("alpah")
    with pytest.raises(DuplicateNameError, match="widget 'alpha' is registered twice"):
        r.register("alpha", 2)
    r.replace("alpha", 3)
    assert r.get("alpha") == 3
    r.freeze("the app has started")
    assert r.frozen == "the app has started"
    with pytest.raises(RuntimeError, match="the app has started"):
        r.register("beta", 4)
    assert r.names() == ["alpha"]


def test_first_use_hooks_run_once_before_a_lookup_and_state_restores():
    r, calls = Registry("widget"), []
    r.on_first_use(lambda: calls.append(r.register("late", "made by the hook")))
    r.register("early", -1)
    assert calls == [] and list(r.current()) == ["early"]  # nothing looked up yet
    assert r.names() == ["early", "late"] and r.get("late") == "made by the hook"
    assert calls == ["made by the hook"]  # once, however many lookups
    saved = r.snapshot()
    r.problem("Plug-in 'x' was not loaded: ImportError.")
    r.unregister("late")
    assert r.problems() == ["Plug-in 'x' was not loaded: ImportError."] and "late" not in r
    r.restore(saved)
    assert r.names() == ["early", "late"] and r.problems() == []


def test_the_methods_and_the_model_families_are_registry_objects():
    assert isinstance(METHODS, Registry) and isinstance(ADAPTERS, Registry)
    assert ADAPTERS.names() == list(FAMILIES)
    with pytest.raises(ValueError, match=r"Unknown model type \('lava'\)\. Did you mean 'llava'"):
        adapter_class("lava")
    assert adapter_class("llava").__name__ == "LlavaAdapter" and ADAPTERS.current()["llava"] is adapter_class("llava")


def test_a_method_is_stored_as_declared_and_the_per_frame_split_is_the_runners():
    """`register_pruner` stores the Params its author gave and nothing more (it wraps nothing); a call may
    also pass the runner's `per_frame`, which `options` derives from the stage and `video`, and which
    `run_pre_llm` applies: on a two-frame input, per_frame="even" is the method on each frame's rows alone."""
    import torch

    from mipruner.pruners import Param, Selection, prune, register_pruner, unregister_pruner
    from mipruner.pruners._registry import get_pruner
    from mipruner.pruners.per_frame import PER_FRAME

    gain = Param.real("gain_x", 1.0, 0.0, 2.0, "a test knob")

    @register_pruner("declared_only", params=(gain,))
    def declared_only(visual, text, budget, *, gain_x=1.0):
        """Largest first coordinate."""
        score = visual[:, 0] * gain_x
        return Selection.from_order(torch.topk(score, budget).indices, score)

    try:
        spec = get_pruner("declared_only")
        assert spec.params == (gain,)
        assert spec.options == (gain, PER_FRAME) and spec.param_names == ("gain_x", "per_frame")
        assert get_pruner("evs").options == get_pruner("evs").params  # selects along time: no split
        assert all(p.name != "per_frame" for p in get_pruner("fastv").options)  # in-LLM: no split
        visual = torch.tensor([[5.0], [4.0], [3.0], [0.0], [1.0], [2.0]])
        frames = torch.tensor([0, 0, 0, 1, 1, 1])
        flat = prune("declared_only", visual=visual, budget=2, frame_index=frames)
        split = prune("declared_only", visual=visual, budget=2, frame_index=frames, per_frame="even")
        assert flat.keep.tolist() == [0, 1] and split.keep.tolist() == [0, 5]
        with pytest.raises(ValueError, match="per_frame"):
            prune("declared_only", visual=visual, budget=2, frame_index=frames, per_frame="sideways")
    finally:
        unregister_pruner("declared_only")
