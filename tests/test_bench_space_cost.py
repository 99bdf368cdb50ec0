"""bench space-cost: a warm-up, repeated rounds in a rotated order, the cold round kept apart, and MI's ratio
with its floor (no timing is asserted)."""
from __future__ import annotations

from mipruner.bench import space_cost


def test_rotation_puts_each_step_first_once_per_cycle():
    orders = [space_cost.rotated(space_cost.STEPS, r) for r in range(3)]
    assert [o[0] for o in orders] == list(space_cost.STEPS) and all(sorted(o) == sorted(space_cost.STEPS)
                                                                    for o in orders)
    assert space_cost.rotated(space_cost.STEPS, 3) == orders[0]


def test_a_tiny_run_repeats_each_step_in_rotated_order():
    lines = []
    got = space_cost.measure(tiny=True, new_tokens=2, warmup=1, repeats=3, log=lines.append)
    steps = ("encode", *space_cost.STEPS, "mi_10_select")
    assert set(got["cold"]) == set(steps) and all(len(got["runs"][k]) == 3 for k in steps)
    assert all(got[f"{k}_s"]["n"] == 3 for k in steps)
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == 4 and "warm-up" in rounds[0] and all("timed" in line for line in rounds[1:])
    for r, line in enumerate(rounds):  # the order each round ran, as the log says
        assert " -> ".join(space_cost.rotated(space_cost.STEPS, r)) in line
    assert got["mi_10_input_tokens"] == got["input_tokens"] - got["n_visual"] + got["mi_10_kept"]
    assert 0 < got["mi_10_floor"] < 1
    assert "gradio" not in got["imported"] or got["imported"][0] == "gradio"  # a child process imports it
    text = space_cost.format_table(got)
    assert "| cold (first request) |" in text and "(FLOPs)]" in text


def test_fewer_views_encodes_the_base_view_too_in_rotated_order():
    got = space_cost.measure(tiny=True, new_tokens=2, warmup=1, repeats=1, log=lambda line: None, fewer_views=True)
    extra = ("encode_base", "view_6_base", "first_panels", "first_panels_base")
    assert set(extra) <= set(got["cold"]) and all(len(got["runs"][k]) == 1 for k in extra)
    assert got["n_visual_base"] < got["n_visual"]  # the base view: g x g tokens and a newline
    run = {k: got["runs"][k][0] for k in got["runs"]}
    assert run["first_panels_base"] == run["encode_base"] + run["view_6_base"]
    assert run["first_panels"] == run["encode"] + run["view_6"]
    assert "the base view only" in space_cost.format_table(got)
