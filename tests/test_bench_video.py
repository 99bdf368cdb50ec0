"""The bench's video input (`mipruner.bench.video`) and its cells in `bench ops` and `bench latency`: the layout
equals the family's own encoding at 8, 16 and 32 frames (tiny models), every cell exists at those token counts,
and the ratios are the cells' medians as the module docstrings state them. No timing is asserted."""
from __future__ import annotations

import json
import math

import pytest
import torch

import mipruner
from mipruner.bench import latency, latency_video, ops
from mipruner.bench import video as V

FRAMES = (8, 16, 32)


@pytest.fixture(scope="module", params=V.FAMILIES)
def tiny(request):
    adapter, _ = V.build(request.param, tiny=True)
    return request.param, adapter


def expected(family: str, adapter, frames: int) -> tuple[int, int]:
    """(N_V, tokens per frame) restated from the config and the processor's resize."""
    v = adapter.config.vision_config
    if family == "qwen2_5_vl":
        w, h = V.media(1, True).frames[0].size
        rh, rw = adapter.video_resize_target(frames, h, w)
        per = (rh // v.patch_size) * (rw // v.patch_size) // v.spatial_merge_size ** 2
        return math.ceil(frames / v.temporal_patch_size) * per, per
    per = math.ceil(v.image_size // v.patch_size / 2) ** 2
    return frames * per + 1, per  # OneVision: one newline for the video


@pytest.mark.parametrize("frames", FRAMES)
def test_layout_is_the_encoding(tiny, frames):
    family, adapter = tiny
    lay = V.layout(adapter, family, frames, True)
    assert (lay.n_visual, lay.per_frame) == expected(family, adapter, frames)
    assert lay.token_frames == (frames // 2 if family == "qwen2_5_vl" else frames)
    enc = adapter.encode(V.media(frames, True), "what is in the video?")
    assert enc.n_visual == lay.n_visual
    assert torch.equal(enc.frame_index.cpu(), lay.frame_index)
    assert lay.hidden == enc.visual.shape[1]
    k = V.retained(lay)
    assert k == max(lay.per_frame, int(lay.per_frame * lay.token_frames * (1 - V.RATE)))


def test_ops_video_cells_at_each_frame_count(tmp_path, tiny):
    family, adapter = tiny
    out = tmp_path / "ops.json"
    ops.main(["--video-frames", ",".join(map(str, FRAMES)), "--video-family", family, "--tiny", "--repeats", "1",
              "--json", str(out)])
    rows = json.loads(out.read_text())
    labels = [f"evs vpr={V.RATE:g}", "vidcom2", "fastvid"]
    assert [(r["video"]["frames"], r["method"]) for r in rows] == [(f, m) for f in FRAMES for m in labels]
    for r in rows:
        lay = V.layout(adapter, family, r["video"]["frames"], True)
        assert r["n_v"] == lay.n_visual and r["k"] == V.retained(lay) and r["d"] == lay.hidden
        assert r["ops"] > 0 and r["eager_ms"] > 0


def test_video_ratios_are_the_cells_medians():
    def cell(kind, method, ms, frames=8):
        return {"kind": kind, "method": method, "frames": frames, "total_ms": {"median": ms}}

    evs = latency_video.label("evs")
    cells = [cell("prefill", "none", 100.0), cell("prefill", evs, 30.0), cell("select", evs, 2.1),
             cell("prefill", "vidcom2", 40.0), cell("select", "vidcom2", 6.0),
             cell("prefill", "fastvid", 120.0), cell("select", "fastvid", 1.0),
             cell("prefill", "none", 999.0, frames=16)]  # another frame count's group: never mixed in
    g = latency_video.video_goals(cells, 8, ["evs", "vidcom2", "fastvid"], {"evs": 0.25, "vidcom2": 0.25})
    assert g[evs]["select_vs_saved"] == round(2.1 / (100.0 - 30.0), 4) and g[evs]["saved_ms"] == 70.0
    assert g[evs]["prefill_ratio"] == 0.3 and g[evs]["prefill_ratio_floor"] == 0.25
    assert g["vidcom2"]["select_vs_saved"] == 0.1
    assert g["fastvid"]["select_vs_saved"] is None  # saved nothing: no ratio
    assert g["fastvid"]["prefill_ratio_floor"] is None


def test_ttft_ratios_and_their_floors():
    def cell(method, ms, fl):
        return {"kind": "latency", "method": method, "frames": 8, "ttft_ms": {"median": ms, "low": None},
                "floor": {"prefill_flops": fl}}

    cells = [cell("generate", 400.0, 100.0), cell("ours-none", 500.0, 100.0),
             cell("ours-" + latency_video.label("evs"), 200.0, 30.0)]
    t = latency_video.ttft_goals(cells, 8)
    assert t["evs_ttft_vs_none"] == 0.4 and t["evs_ttft_vs_generate"] == 0.5
    assert t["evs_ttft_vs_none_floor"] == (0.3, "FLOPs") and t["evs_ttft_vs_generate_floor"] == (0.3, "FLOPs")


def test_latency_video_report_carries_the_ratios(tmp_path):
    out = tmp_path / "lat.json"
    latency.main(["--video-frames", "4,8", "--video-family", "qwen2_5_vl", "--tiny", "--repeats", "1",
                  "--warmup", "0", "--lengths", "2", "--vision-layers", "1", "--json", str(out)])
    rep = json.loads(out.read_text())
    methods = [m for m in V.METHODS if m in mipruner.list_pruners()]
    adapter, _ = V.build("qwen2_5_vl", tiny=True)
    for f in ("4", "8"):
        v = rep["video"][f]
        lay = V.layout(adapter, "qwen2_5_vl", int(f), True)
        assert v["layout"]["n_visual"] == lay.n_visual and v["k"] == V.retained(lay)
        mine = [c for c in rep["cells"] if c["frames"] == int(f)]
        med = {(c["kind"], c["method"]): c["total_ms"]["median"] for c in mine}
        for m in methods:
            g = v["methods"][latency_video.label(m)]
            saved = med[("prefill", "none")] - med[("prefill", latency_video.label(m))]
            assert g["saved_ms"] == saved and g["select_ms"] == med[("select", latency_video.label(m))]
            assert g["select_vs_saved"] == (round(g["select_ms"] / saved, 4) if saved > 0 else None)
            assert 0 < g["prefill_ratio_floor"] < 1  # K < N_V: fewer prefill FLOPs
    assert "ttft" in rep["video"]["4"] and "ttft" not in rep["video"]["8"]  # --ttft-frames: the first by default
    lat = {c["method"]: c for c in rep["cells"] if c["kind"] == "latency"}
    assert set(lat) == {"generate", "ours-none", "ours-" + latency_video.label("evs")}
    assert lat["ours-" + latency_video.label("evs")]["prompt_tokens"] < lat["ours-none"]["prompt_tokens"]
    assert lat["generate"]["prompt_tokens"] == lat["ours-none"]["prompt_tokens"]
    assert rep["video"]["4"]["ttft"]["evs_ttft_vs_none"] == round(
        lat["ours-" + latency_video.label("evs")]["ttft_ms"]["median"] / lat["ours-none"]["ttft_ms"]["median"], 3)
    d = rep["video"]["4"]["decode"]  # DyCoke's decode-time stage: fewer decoding FLOPs than keep-all's
    dec = {c["method"]: c for c in rep["cells"] if c["kind"] == "decode"}
    assert set(dec) == {"dycoke", "dycoke-keep-all"} and d["steps"] == 1
    assert 0 < d["decode_flops_share"] < 1 and 0 <= d["visual_keys_share"] < 1
    assert d["decode_ms_ratio"] == round(dec["dycoke"]["decode_ms_per_token"]["median"]
                                         / dec["dycoke-keep-all"]["decode_ms_per_token"]["median"], 3)


def test_ops_video_rows_of_an_image_method_per_frame(tmp_path):
    """`--per-frame even`: an image method runs with its per-frame budgets on the video's layout."""
    out = tmp_path / "ops.json"
    ops.main(["--video-frames", "8", "--video-family", "qwen2_5_vl", "--tiny", "--repeats", "1",
              "--methods", "evs,mi,random", "--per-frame", "even", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == [f"evs vpr={V.RATE:g}", "mi lam=1 per_frame=even",
                                           "mi lam=0.5 per_frame=even", "random per_frame=even"]
    assert len({r["k"] for r in rows}) == 1 and all(r["ops"] > 0 for r in rows)
