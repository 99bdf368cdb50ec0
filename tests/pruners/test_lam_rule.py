"""The paper's lambda rule: which prompts are closed-form, and `mipruner.select` applying it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.models.common.dummy import DummyAdapter
from mipruner.pruners import get_pruner
from mipruner.pruners.lam_rule import LAM_RULE, prompt_form, resolve_lam


@pytest.mark.parametrize("prompt, kind", [
    ("is there a purple square?", "yes/no"),
    ("Is there a dog in the image?", "yes/no"),  # POPE
    ("Does the man wear a hat? Please answer yes or no.", "yes/no"),  # MME
    ("Look at the picture.\nAre the two cars the same colour?", "yes/no"),
    ("Answer yes or no: the cup is on the left.", "yes/no"),
    ("Which animal is shown?\nA. cat\nB. dog\nC. bird\nAnswer with the option's letter from the given choices "
     "directly.", "multiple choice"),  # LLaVA's ScienceQA / MMBench prompt
    ("Which one is red? (A) the ball (B) the box", "multiple choice"),
    ("What is the capital? Options: Paris, Rome", "multiple choice"),
    ("what color is the triangle?", "open"),
    ("how many triangles are there?", "open"),
    ("Describe the image in detail.", "open"),
    ("Is the ball red or blue?", "open"),  # an alternative question names its answers, not yes/no
    ("What is this? Is it a tool", "open"),  # no question mark on the auxiliary sentence
    ("", "open"),
])
def test_prompt_form(prompt, kind):
    form = prompt_form(prompt)
    assert form.kind == kind and form.lam == (0.5 if kind == "open" else 1.0) and form.closed == (kind != "open")


def test_resolve_lam_rules():
    assert LAM_RULE.default == "auto" and LAM_RULE.choices == ("auto", "fixed")
    assert resolve_lam({}, "Is it red?", 0.5) == ({"lam": 1.0, "lam_rule": "auto"}, "lam 1 (auto: yes/no)")
    assert resolve_lam({}, "What is it?", 0.5)[0]["lam"] == 0.5
    # lam alone means fixed; auto given explicitly wins over lam; fixed without lam is the default
    assert resolve_lam({"lam": 0.3}, "Is it red?", 0.5) == ({"lam": 0.3, "lam_rule": "fixed"}, "lam 0.3 (fixed)")
    assert resolve_lam({"lam": 0.3, "lam_rule": "auto"}, "Is it red?", 0.5)[0]["lam"] == 1.0
    assert resolve_lam({"lam_rule": "fixed"}, "Is it red?", 0.5)[0]["lam"] == 0.5


def dummy_scene():
    a = np.full((32, 32, 3), 40, np.uint8)
    a[8:16, 16:24] = 255
    a[0:8, 0:8] = 200
    a[24:32, 8:16] = 120
    return Image.fromarray(a)


@pytest.mark.parametrize("name", ["mi", "mi_attention", "mi_adaptive"])
def test_select_applies_the_rule_to_every_mi_method(name):
    assert "lam_rule" in get_pruner(name).param_names
    ad = DummyAdapter(patch=8)
    closed = ad.encode(dummy_scene(), "Is there a white square?", need_attention=True)
    opened = ad.encode(dummy_scene(), "Where is the white square?", need_attention=True)
    for enc, lam in ((closed, 1.0), (opened, 0.5)):
        auto = mipruner.select(ad, enc, name, 5)
        fixed = mipruner.select(ad, enc, name, 5, lam=lam)
        assert torch.equal(auto.order, fixed.order) and auto.extras["lam"] == lam
        assert auto.extras["lam_note"].startswith(f"lam {lam:g} (auto: ")
        assert fixed.extras["lam_note"] == f"lam {lam:g} (fixed)"
    # the choice is visible: a fixed lam other than the rule's gives another selection here (mi_attention:
    # round 1 keeps 1 of the 5, so that MI picks 4; with its default split of 0.5, round 1 takes the scene's
    # 3 distinct patches and MI chooses among identical background ones, which ties break alike at any lam)
    more = {"split": 0.2} if name == "mi_attention" else {}
    a, b = mipruner.select(ad, closed, name, 5, **more), mipruner.select(ad, closed, name, 5, lam=0.0, **more)
    assert not torch.equal(a.order, b.order)
    assert torch.equal(mipruner.select(ad, closed, name, 5, lam=0.0, lam_rule="auto").order, a.order)
    with pytest.raises(ValueError, match="lam_rule must be one of"):
        mipruner.select(ad, closed, name, 5, lam_rule="paper")


def test_prune_on_tensors_uses_lam_as_given():
    torch.manual_seed(0)
    V, T = torch.randn(30, 8), torch.randn(4, 8)
    a = mipruner.prune("mi", visual=V, text=T, budget=6)
    b = mipruner.prune("mi", visual=V, text=T, budget=6, lam=0.5)
    assert torch.equal(a.order, b.order)  # no prompt: lam_rule cannot apply, lam keeps its default
