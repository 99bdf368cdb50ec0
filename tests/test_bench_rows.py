"""bench rows: the real vocabulary at full widths, intervals, a pruned cell and each ratio's floor (no timing
is asserted)."""
from __future__ import annotations

import json

from mipruner.bench import rows


def test_defaults_are_llava_7b_widths_with_its_vocabulary():
    a = rows.parse_args(["--device", "cpu"])
    assert (a.vision_layers, a.vision_width, a.llm_width, a.llm_ffn, a.vocab_size) == (24, 1024, 4096, 11008, 32064)
    assert a.llm_layers == 2 and a.repeats == 6 and a.budget == 64  # the CPU proxy's depth; 6 runs: an interval
    assert rows.parse_args(["--device", "cuda"]).llm_layers == 32
    t = rows.parse_args(["--device", "cpu", "--tiny"])
    assert t.llm_width == 128 and t.vocab_size is None
    assert rows.parse_args(["--device", "cpu", "--llm-width", "256"]).llm_width == 256


def test_a_tiny_run_reports_every_cell_with_intervals_and_floors(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert rows.main(["--tiny", "--device", "cpu", "--batch", "3", "--budget", "8", "--repeats", "6",
                      "--vocab-size", "97", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert list(r["cells"]) == ["generate", "ours", "ours-mi@8"] and r["budget"] == 8
    assert "vocabulary 97" in r["model"]
    for c in r["cells"].values():
        assert c["total_ms"]["n"] == 6 and c["total_ms"]["low"] is not None and len(c["row_tokens"]) == 3
    gen, ours, mi = (r["cells"][k] for k in ("generate", "ours", "ours-mi@8"))
    assert ours["row_tokens"] == gen["row_tokens"]  # the same unpruned rows
    assert [t - o for t, o in zip(ours["row_tokens"], mi["row_tokens"])] == [r["n_visual"] - 8] * 3
    assert ours["vs_generate_floor"] == 1.0 and ours["floor_basis"] == "FLOPs"  # the CPU: the compute floor
    assert 0 < mi["vs_generate_floor"] < 1
    assert r["answers_equal"] == 3
    out = capsys.readouterr().out
    assert "[floor 1.000 (FLOPs)]" in out and "ours-mi@8" in out
