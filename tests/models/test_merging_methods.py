"""The merging methods (ToMe; the video mergers PruneVid and HoliTom where present) on every family, on a real
encoding of each medium it reads (an image on every family, a clip on the families that read video):
  keep-all  K = N_V keeps every token, unchanged, and the prefill logits and the greedy answer are the unpruned
            ones exactly;
  release   the selection equals the restatement of the released code (tests/pruners) on the encoding's visual
            tokens, and the merged rows are what the LLM reads at the kept positions.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.media import write_video
from mipruner.models import FAMILIES

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from ..pruners.test_holitom import released as released_holitom
from ..pruners.test_prunevid import released as released_prunevid
from mipruner.pruners.attention import attention_scores
from ..pruners.test_tome import released as released_tome
from mipruner.pruners.video import frame_slots
from .tiny import save_tiny
from .tiny_llava import scene

PROMPT = "What colour is the square?"
MEDIUMS = [(f, m) for f, fam in FAMILIES.items() for m in ("image", "video") if m in fam.media]


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    root = tmp_path_factory.mktemp("merging_methods")
    clip = write_video([scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(8)],
                       str(root / "clip.mp4"))
    models, done = {}, {}

    def get(family: str, medium: str):
        if family not in models:
            models[family] = mipruner.load(save_tiny(family, str(root / f"tiny-{family}")), device="cpu")
        if (family, medium) not in done:
            media = clip if medium == "video" else scene(120, 40, square=(80, 10, 100, 30))
            done[family, medium] = models[family].encode(media, PROMPT, need_attention=True)
        return models[family], done[family, medium]
    return get


def _stable(v, dim, descending):
    return torch.sort(v, dim=dim, descending=descending, stable=True).indices


@pytest.mark.parametrize("family,medium", MEDIUMS, ids=[f"{f}-{m}" for f, m in MEDIUMS])
def test_tome_keep_all_and_release(encoded, family, medium):
    a, e = encoded(family, medium)
    sel = mipruner.select(a, e, "tome", e.n_visual)
    assert sel.keep.tolist() == list(range(e.n_visual)) and sel.tokens is None
    assert torch.equal(a.prefill_logits(e, keep=sel), a.prefill_logits(e))
    assert mipruner.answer(a, e, sel, max_new_tokens=4).token_ids == a.generate(e, max_new_tokens=4).token_ids
    k = max(2, e.n_visual // 5)
    keep, rows, size, owner = released_tome(e.visual.float(), k, argsort=_stable)
    sel = mipruner.select(a, e, "tome", k)
    assert sel.keep.tolist() == keep.tolist()
    torch.testing.assert_close(sel.tokens.float(), rows.to(sel.tokens.dtype).float(), rtol=0, atol=1e-6)
    assert sel.scores[sel.keep].tolist() == size.tolist()
    merged = a.prefill_logits(e, keep=sel)  # the merged rows reach the LLM at the kept positions
    plain = a.prefill_logits(e, keep=sel.keep)
    assert merged.shape == plain.shape and not torch.equal(merged, plain)


VIDEO = [f for f, m in MEDIUMS if m == "video"]


@pytest.mark.parametrize("family", VIDEO)
def test_prunevid_keep_all_and_release(encoded, family):
    a, e = encoded(family, "video")
    sel = mipruner.select(a, e, "prunevid", e.n_visual)
    assert sel.keep.tolist() == list(range(e.n_visual)) and sel.tokens is None
    assert torch.equal(a.prefill_logits(e, keep=sel), a.prefill_logits(e))
    assert mipruner.answer(a, e, sel, max_new_tokens=4).token_ids == a.generate(e, max_new_tokens=4).token_ids
    table = frame_slots(e.frame_index, e.n_visual, "cpu")
    t, n = table.index.shape
    assert t >= 2, f"{family}: the clip's encoding reads as {t} frame(s)"
    x = e.visual.float()[table.index]  # (T, n, d)
    rows, places = released_prunevid(x, table.index)
    sel = mipruner.select(a, e, "prunevid", e.n_visual - 1)  # the cap above the release's count
    free = table.outside
    at = ~torch.isin(sel.keep, free)
    order = torch.argsort(places)
    assert sel.keep[at].tolist() == places[order].tolist() and bool(torch.isin(free, sel.keep).all())
    torch.testing.assert_close(sel.tokens[at].float(), rows[order].to(sel.tokens.dtype).float(), rtol=0, atol=1e-5)
    merged = a.prefill_logits(e, keep=sel)  # the merged rows reach the LLM at the kept positions
    plain = a.prefill_logits(e, keep=sel.keep)
    assert merged.shape == plain.shape and not torch.equal(merged, plain)


@pytest.mark.parametrize("family", VIDEO)
def test_holitom_keep_all_and_release(encoded, family):
    a, e = encoded(family, "video")
    sel = mipruner.select(a, e, "holitom", e.n_visual)
    assert sel.keep.tolist() == list(range(e.n_visual)) and sel.tokens is None
    assert torch.equal(a.prefill_logits(e, keep=sel), a.prefill_logits(e))
    assert mipruner.answer(a, e, sel, max_new_tokens=4).token_ids == a.generate(e, max_new_tokens=4).token_ids
    table = frame_slots(e.frame_index, e.n_visual, "cpu")
    t, n = table.index.shape
    free = table.outside
    x = e.visual.float()[table.index]  # (T, n, d)
    att = attention_scores(e.attention, e.n_visual)[table.index]
    k = free.numel() + t * n // 4
    sel = mipruner.select(a, e, "holitom", k)
    rows, places = released_holitom(x, att, table.index, (k - free.numel()) / (t * n),
                                    fitted=float(sel.extras["retain_ratio"]))
    at = ~torch.isin(sel.keep, free)
    order = torch.argsort(places)
    assert sel.keep[at].tolist() == places[order].tolist() and bool(torch.isin(free, sel.keep).all())
    torch.testing.assert_close(sel.tokens[at].float(), rows[order].to(sel.tokens.dtype).float(), rtol=0, atol=1e-5)
    merged = a.prefill_logits(e, keep=sel)
    plain = a.prefill_logits(e, keep=sel.keep)
    assert merged.shape == plain.shape and not torch.equal(merged, plain)
