"""The front end's request checks and the request's trip to the worker, without an engine."""
import pytest

from mipruner.pruners._registry import METHODS, get_pruner
from mipruner_vllm.request import COUNT_FROM_GRID, PruneRequest, check_budget, parse, why_not


def words(text):
    return [len(w) for w in text.split()]  # a stand-in tokenizer: one id per word


def test_every_registered_method_runs_or_says_why_not():
    runs = set()
    for name in METHODS:
        spec, reason = get_pruner(name), why_not(name)
        fits = spec.stage == "projector" and (not spec.adaptive or name in COUNT_FROM_GRID)
        assert (reason is None) == fits, (name, reason)
        on_image = why_not(name, "image")
        assert (on_image is None) == (fits and not spec.video), (name, on_image)
        if reason is None:
            runs.add(name)
        else:
            assert repr(name) in reason and "mipruner_method" in reason
    assert {"mi", "random", "similarity", "divprune", "cdpruner", "pool", "evs", "vidcom2"} <= runs


def test_evs_count_is_known_before_scheduling():
    """EVS at a rate: min(budget, vLLM's retained count max(P, int(T P (1 - q)))), from the grid alone."""
    req = parse({"mipruner_method": "evs", "mipruner_budget": 1.0, "mipruner_video_pruning_rate": 0.4}, words)
    assert check_budget(req, 64, 4) == 38 and check_budget(req, 32, 2) == 19
    req = parse({"mipruner_method": "evs", "mipruner_budget": 10, "mipruner_video_pruning_rate": 0.4}, words)
    assert check_budget(req, 64, 4) == 10


def test_a_request_travels_to_the_worker_unchanged():
    req = parse({"mipruner_method": "mi", "mipruner_budget": 0.25, "mipruner_query": "is it red ?",
                 "mipruner_lam": 0.3, "other_key": 1}, words)
    assert req.query_ids == (2, 2, 3, 1) and req.params["lam"] == 0.3
    rows = req.to_tensor(3)
    assert rows.shape[0] == 3 and all(PruneRequest.from_tensor(r) == req for r in rows)
    assert check_budget(req, 576) == 144
    assert parse({"max_pixels": 100}, words) is None
    assert PruneRequest.from_tensor(PruneRequest.off_tensor(1)[0]) is None


@pytest.mark.parametrize("kw, field", [({"mipruner_method": "random", "mipruner_budget": True}, "mipruner_budget"),
                                       ({"mipruner_method": 3, "mipruner_budget": 4}, "mipruner_method"),
                                       ({"mipruner_method": "random", "mipruner_budget": 4, "mipruner_query": 5},
                                        "mipruner_query")])
def test_wrong_types_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        parse(kw, words)
    req = parse({"mipruner_method": "random", "mipruner_budget": 20}, words)
    with pytest.raises(ValueError, match="mipruner_budget"):
        check_budget(req, 16)
