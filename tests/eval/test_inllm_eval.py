"""The eval runner takes the in-LLM methods (fastv, dart) by name, on a tiny LLaVA built offline."""
import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.eval.__main__ import main
from mipruner.eval.runner import evaluate
from mipruner.eval.tasks import EvalItem

from ..models.tiny_llava import save_tiny, scene


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("eval_llava") / "llava")), device="cpu")


def _items():
    out = []
    for i in range(3):
        mask = np.zeros((56, 56), bool)
        mask[14:28, 28:42] = True
        im = scene(56, 56, square=(28, 14, 42, 28), seed=i)
        out.append(EvalItem(id=str(i), media=im, question="Is there a red square?", kind="yesno",
                            answer="yes", split="random", masks=[mask]))
    return out


def test_runner_accepts_fastv_and_dart(adapter):
    n_v = 16  # the tiny tower's 4 x 4 grid
    with torch.no_grad():
        rows = evaluate(adapter, _items(), ["none", "fastv", "dart"], [4, n_v], {"layer": 1, "lam": 1.0}, "toy",
                        max_new_tokens=3)
    get = {(r["method"], r["budget"]): r for r in rows}
    assert set(get) == {("none", "all"), ("fastv", 4), ("fastv", n_v), ("dart", 4), ("dart", n_v)}
    # keeping all 16 tokens answers exactly as the unpruned model (inllm's keep-all equality)
    for m in ("fastv", "dart"):
        assert get[(m, n_v)]["yes_rate"] == get[("none", "all")]["yes_rate"]
        assert get[(m, n_v)]["query_recall"] == 1.0
        assert 0.0 <= get[(m, 4)]["query_recall"] <= 1.0 and get[(m, 4)]["n"] == 3


def test_cli_knows_the_in_llm_names():
    with pytest.raises(ValueError, match="Unknown pruner"):
        main(["--methods", "fastv,nosuch", "--model", "nowhere"])  # fails before loading a model
