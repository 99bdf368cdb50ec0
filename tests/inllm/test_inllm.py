"""FastV and DART inside the LLM (`mipruner.inllm`) on tiny LLaVA / Qwen checkpoints built offline.

  keep-all     logits torch.equal the adapter's unpruned prefill; greedy tokens equal its generate
               (with and without the select cache), for every family and K in {1, 2};
  pruned       logits (1e-5) and greedy tokens equal the model's OWN forward on the full sequence
               with the dropped tokens hidden as keys in layers >= K only (tests/inllm/reference.py);
  FastV        its scores are the last token's head-mean attention at layer K-1 read from the
               model's eager `output_attentions`, its keep their top-k;
  DART         pivots and picks by hand on 2-D vectors; on a model, the keep equals the rule applied
               to keys and hidden states read from the model's own outputs;
  cache        another budget or method at the same K runs no decoder layer (counting hook);
               generate with the cache runs only layers >= K on the prompt;
  errors       unknown method / parameter, bad layer / budget / pivots, foreign cache, dummy adapter.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import mipruner
from mipruner import inllm
from mipruner.media import write_video
from mipruner.inllm.dart import dart_rank
from mipruner.models.common.dummy import DummyAdapter

from ..models import tiny_qwen
from ..paths import assert_paths_close
from ..models.test_qwen_family import scene as qwen_scene
from ..models.test_qwen_family import video as qwen_video
from ..models.tiny_llava import save_tiny, scene
from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from .reference import reference_run

PROMPT = "What colour is the square?"
LLAVA = ("llava", "llava_next", "video_llava")
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("inllm"))


@contextlib.contextmanager
def decoder_layer_calls(adapter):
    """A list counting the calls of each decoder layer while the block runs (hooks removed after)."""
    layers = adapter.model.model.language_model.layers
    calls = [0] * len(layers)
    handles = [m.register_forward_hook(lambda *_a, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, m in enumerate(layers)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def tiny_checkpoints(root) -> dict:
    """family -> a tiny checkpoint saved under `root`, from tests/models' builders as they stand."""
    out = {fam: save_tiny(fam, str(root / fam)) for fam in LLAVA}
    out.update({kind: tiny_qwen.build(kind, str(root)) for kind in QWEN})
    return out


@pytest.fixture(scope="module")
def adapters(paths):
    return {fam: mipruner.load(p, device="cpu") for fam, p in paths.items()}


CASES = [("llava", "image"), ("llava_next", "image"), ("video_llava", "image"), ("video_llava", "video"),
         ("qwen2_vl", "image"), ("qwen2_5_vl", "image"), ("qwen3_vl", "image"), ("qwen3_vl", "video")]


@pytest.fixture(scope="module")
def encoded(adapters, tmp_path_factory):
    out = {}
    for fam, media in CASES:
        if fam in LLAVA and media == "video":  # 8 frames x (16 patches + [CLS])
            frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(12)]
            path = write_video(frames, str(tmp_path_factory.mktemp("vid") / "clip.mp4"))
            out[fam, media] = adapters[fam].encode(path, PROMPT)
        elif fam in LLAVA:
            out[fam, media] = adapters[fam].encode(scene(112, 56, square=(70, 14, 84, 28)), PROMPT)
        else:
            out[fam, media] = adapters[fam].encode(qwen_video() if media == "video" else qwen_scene(), PROMPT)
    return out


def _id(c):
    return "-".join(c)


# ------------------------------------------------------------------------------------ keep-all
@pytest.mark.parametrize("fam,media", CASES, ids=[_id(c) for c in CASES])
def test_keep_all_is_the_unpruned_model(adapters, encoded, fam, media):
    ad, enc = adapters[fam], encoded[fam, media]
    ref = ad.prefill_logits(enc)
    ans = ad.generate(enc, max_new_tokens=5)
    for layer in (1, 2):
        assert torch.equal(inllm.prefill_logits(ad, enc, None, layer=layer), ref)
        assert torch.equal(inllm.prefill_logits(ad, enc, torch.arange(enc.n_visual), layer=layer), ref)
        got = inllm.generate(ad, enc, None, layer=layer, max_new_tokens=5)
        assert got.token_ids == ans.token_ids
        assert got.input_tokens == ans.input_tokens and got.visual_tokens == enc.n_visual
    cache: dict = {}
    sel = mipruner.select(ad, enc, "fastv", 1.0, cache=cache, layer=1)
    assert sel.budget == enc.n_visual
    assert mipruner.answer(ad, enc, sel, max_new_tokens=5, cache=cache).token_ids == ans.token_ids


# ------------------------------------------------------------------------------------ pruned
def _reference_inputs(ad, enc):
    """(prefill kwargs, step kwargs fn) of the model's own forward on the full sequence."""
    L = int(enc.state.input_ids.shape[-1])
    if ad.family in LLAVA:
        embeds = ad.pruned_inputs(enc, None)["inputs_embeds"]
        inputs = dict(inputs_embeds=embeds, attention_mask=torch.ones(1, L, dtype=torch.long))

        def step(token, s):
            return dict(input_ids=torch.tensor([[token]]), attention_mask=torch.ones(1, L + s, dtype=torch.long),
                        position_ids=torch.tensor([[L + s - 1]]))
        return inputs, step
    st = enc.state
    inputs = dict(input_ids=st.input_ids, mm_token_type_ids=st.mm_token_type_ids, position_ids=st.positions,
                  attention_mask=torch.ones(1, L, dtype=torch.long), **st.vision_inputs, **st.rope_kwargs)
    start = int(st.positions.max()) + 1

    def step(token, s):
        return dict(input_ids=torch.tensor([[token]]), position_ids=torch.full((3, 1, 1), start + s - 1),
                    attention_mask=torch.ones(1, L + s, dtype=torch.long))
    return inputs, step


PRUNED = [(fam, media, method) for fam, media in [("llava", "image"), ("llava_next", "image"), ("video_llava", "video"),
                                                  ("qwen2_vl", "image"), ("qwen3_vl", "image"), ("qwen3_vl", "video")]
          for method in ("fastv", "dart")]


@pytest.mark.parametrize("fam,media,method", PRUNED, ids=[_id(c) for c in PRUNED])
def test_pruned_equals_masking_from_layer_k(adapters, encoded, fam, media, method):
    ad, enc = adapters[fam], encoded[fam, media]
    layer = 1  # the tiny models have 2 decoder layers: layer 0 full, layer 1 pruned
    k = max(1, enc.n_visual // 4)
    sel = mipruner.select(ad, enc, method, k, layer=layer)
    assert sel.budget == k and sel.method == method and sel.extras["layer"] == layer
    L = int(enc.state.input_ids.shape[-1])
    dropped = torch.zeros(L, dtype=torch.bool)
    gone = torch.ones(enc.n_visual, dtype=torch.bool)
    gone[sel.keep] = False
    dropped[enc.state.visual_positions.cpu()[gone]] = True
    inputs, step = _reference_inputs(ad, enc)
    ref_logits, ref_tokens, margins = reference_run(ad.model, inputs, step, layer, dropped, max_new_tokens=5)
    got = inllm.prefill_logits(ad, enc, sel, layer=layer)
    assert got.shape[0] == L - (enc.n_visual - k)
    torch.testing.assert_close(got, ref_logits[~dropped], atol=1e-5, rtol=1e-5)
    ans = inllm.generate(ad, enc, sel, layer=layer, max_new_tokens=5)
    eos = set(inllm._run._get_prompt(ad, enc, None).eos)
    cut = next((i + 1 for i, t in enumerate(ref_tokens) if t in eos), len(ref_tokens))
    if ans.token_ids != ref_tokens[:cut]:  # allowed only where the reference's greedy step is a near-tie
        first = next((i for i, (a, b) in enumerate(zip(ans.token_ids, ref_tokens)) if a != b),
                     min(len(ans.token_ids), cut))
        assert first < len(margins) and margins[first] < 1e-4, (ans.token_ids, ref_tokens[:cut], margins)
    assert ans.input_tokens == L - (enc.n_visual - k) and ans.visual_tokens == k
    # the pruned run is not the unpruned one (the test could fail)
    assert not torch.allclose(got, ad.prefill_logits(enc)[~dropped], atol=1e-4)


def test_layer_at_the_depth_leaves_the_answer_unpruned(adapters, encoded):
    ad, enc = adapters["qwen2_vl"], encoded["qwen2_vl", "image"]
    depth = len(ad.model.model.language_model.layers)
    keep = torch.arange(0, enc.n_visual, 3)
    rows = inllm._run._get_prompt(ad, enc, None).kept_sequence(keep)
    # the head runs on the kept rows only there (a matrix product of another shape): within tolerance
    assert_paths_close(inllm.prefill_logits(ad, enc, keep, layer=depth), ad.prefill_logits(enc)[rows], name="logits")
    assert inllm.generate(ad, enc, keep, layer=depth, max_new_tokens=4).token_ids == \
        ad.generate(enc, max_new_tokens=4).token_ids


def test_min_new_tokens_forces_the_length(adapters, encoded):
    ad, enc = adapters["llava"], encoded["llava", "image"]
    ans = inllm.generate(ad, enc, [0, 3], layer=1, max_new_tokens=7, min_new_tokens=7)
    assert len(ans.token_ids) == 7 and not set(ans.token_ids) & set(inllm._run._get_prompt(ad, enc, None).eos)


# ------------------------------------------------------------------------------------ FastV
def _eager(paths, fam):
    from transformers import AutoModelForImageTextToText, LlavaForConditionalGeneration, LlavaNextForConditionalGeneration

    cls = {"llava": LlavaForConditionalGeneration, "llava_next": LlavaNextForConditionalGeneration}.get(
        fam, AutoModelForImageTextToText)
    return cls.from_pretrained(paths[fam], attn_implementation="eager").eval()


@pytest.mark.parametrize("fam", ["llava", "qwen2_vl", "qwen3_vl"])
def test_fastv_is_the_top_k_of_eager_attention(paths, adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam, "image"]
    eager = _eager(paths, fam)
    if fam in LLAVA:
        inputs = dict(inputs_embeds=ad.pruned_inputs(enc, None)["inputs_embeds"])
    else:
        inputs = ad._llm_inputs(enc, None)  # the adapter's own public-input kwargs (ids, positions, visual rows)
    vis = enc.state.visual_positions.cpu()
    for layer in (1, 2):
        att = eager(**inputs, output_attentions=True).attentions[layer - 1]  # (1, H, L, L)
        expected = att[0, :, -1, vis].float().mean(0)  # the last token's head-mean attention on the image
        sel = mipruner.select(ad, enc, "fastv", 5, layer=layer)
        torch.testing.assert_close(sel.scores, expected, atol=1e-6, rtol=1e-5)
        # the top 5 of the eager attention, in its order, up to near-ties (the two are computed differently);
        # where it separates its 5th from its 6th token by more than `tol`, exactly its topk
        tol = 1e-5
        kept = expected[sel.order]
        dropped = expected[~torch.isin(torch.arange(expected.numel()), sel.keep)]
        assert sel.keep.numel() == 5 and bool((kept[:-1] >= kept[1:] - tol).all())
        assert float(kept.min()) >= float(dropped.max()) - tol


# ------------------------------------------------------------------------------------ DART
def test_dart_rule_by_hand():
    # six image tokens on the unit circle, one text token pointing up
    ang = torch.tensor([0.0, 180.0, 270.0, 90.0, 45.0, 200.0]) * torch.pi / 180
    img = torch.stack([ang.cos(), ang.sin()], 1)  # (6, 2)
    txt = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    key_img = torch.tensor([5.0, 1.0, 1.0, 1.0, 2.0, 1.0])  # token 0 is the image pivot, then 4
    key_txt = torch.tensor([3.0, 1.0])  # text token 0 (up) is the text pivot
    sel = dart_rank(key_img, key_txt, img, txt, budget=3, image_pivots=1, text_pivots=1)
    # 2 picks for 2 pivots: pivot 0 (east) takes the westmost (180 deg); the up-pivot the downmost (270 deg)
    assert sel.order.tolist() == [0, 1, 2] and sel.keep.tolist() == [0, 1, 2]
    assert sel.extras["pivots_image"].tolist() == [0] and sel.extras["pivots_text"].tolist() == [0]
    assert sel.extras["picked_by"].tolist() == [0, 0, 1, -1, -1, -1]
    assert sel.scores[1].item() == pytest.approx(1.0) and sel.scores[2].item() == pytest.approx(1.0)
    # 3 picks for 2 pivots: the first pivot gets 2 (180 then 200 deg), the up-pivot 1 (270 deg)
    sel = dart_rank(key_img, key_txt, img, txt, budget=4, image_pivots=1, text_pivots=1)
    assert sel.order.tolist() == [0, 1, 5, 2]
    # two image pivots (0, then 4 by key norm) and no text pivot: picks share out 1 + 1
    sel = dart_rank(key_img, key_txt, img, txt, budget=4, image_pivots=2, text_pivots=0)
    assert sel.order.tolist() == [0, 4, 1, 5]  # 0 -> 180 deg; 45 deg -> least similar left: 200 deg
    # budget below the pivot count: the top-norm image tokens only
    assert dart_rank(key_img, key_txt, img, txt, budget=1).keep.tolist() == [0]


def test_dart_visit_order_follows_python_sets():
    # image tokens at angles 0, 180, 270, 90, 45, 190, 260 deg; pivots: image token 0 (east), text token 0 (up).
    # East's least similar: 180, then 190; up's: 270, then 260. Budget 4 = the image pivot + 3 picks, so the
    # pivot visited first takes 2: east first keeps {0, 180, 190, 270}, up first keeps {0, 270, 260, 180}.
    ang = torch.tensor([0.0, 180.0, 270.0, 90.0, 45.0, 190.0, 260.0]) * torch.pi / 180
    img = torch.stack([ang.cos(), ang.sin()], 1)
    txt = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    key_img = torch.tensor([5.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    key_txt = torch.tensor([3.0, 1.0])
    # the release visits list(set(positions)): image at 0..6, text at 7, 8 -> slots 0 and 7: east first
    east_first = dart_rank(key_img, key_txt, img, txt, budget=4, image_pivots=1, text_pivots=1)
    assert east_first.extras["visit"].tolist() == [0, 7] == list({0, 7})
    assert east_first.keep.tolist() == [0, 1, 2, 5] and east_first.order.tolist() == [0, 1, 5, 2]
    # image at 30..36, text at 37, 38: the pivots sit at 30 and 37, slots 30 mod 8 = 6 and 37 mod 8 = 5: up first
    up_first = dart_rank(key_img, key_txt, img, txt, budget=4, image_pivots=1, text_pivots=1,
                         image_positions=torch.arange(30, 37), text_positions=torch.arange(37, 39))
    assert up_first.extras["visit"].tolist() == [37, 30] == list({30, 37})
    assert up_first.keep.tolist() == [0, 1, 2, 6] and up_first.order.tolist() == [0, 2, 6, 1]
    assert up_first.extras["picked_by"].tolist() == [1, 1, 0, -1, -1, -1, 0]
    # the release's count: each pivot takes floor(4 / 2) = 2, so 1 + 2 * 2 = 5 are kept
    orig = dart_rank(key_img, key_txt, img, txt, budget=4, image_pivots=1, text_pivots=1, count_rule="original")
    assert orig.keep.tolist() == [0, 1, 2, 5, 6] and orig.budget == 5
    # ... capped by what is left: 7 tokens, floor(12 / 2) = 6 each -> the first takes 6, the second nothing
    assert dart_rank(key_img, key_txt, img, txt, budget=7, image_pivots=1, text_pivots=1,
                     count_rule="original").budget == 7


def test_set_order_is_cpython_set_iteration():
    import random

    from mipruner.inllm.dart import set_order

    rng = random.Random(0)
    for _ in range(3000):
        hi = rng.choice([50, 700, 10**6])
        vals = [rng.randrange(hi) for _ in range(rng.randint(0, 12))]
        assert set_order(vals) == list(set(vals).copy()), vals
    # 8 pivots as the release has them: positions mod 32, collisions probed
    assert set_order([100, 68, 36, 4, 611, 612, 640, 700]) == list(set([100, 68, 36, 4, 611, 612, 640, 700]))


@pytest.mark.parametrize("fam", ["llava", "qwen2_vl"])
def test_dart_reads_keys_and_hidden_states_of_the_model(adapters, encoded, fam):
    ad, enc = adapters[fam], encoded[fam, "image"]
    layer = 1
    inputs, _ = _reference_inputs(ad, enc)
    from transformers import DynamicCache

    cache = DynamicCache(config=ad.model.config.get_text_config())
    out = ad.model(**inputs, past_key_values=cache, use_cache=True, output_hidden_states=True)
    keys = cache.layers[layer - 1].keys[0]  # (KV, L, d_head)
    l1 = keys.abs().sum(dim=(0, 2))  # (L,)
    hidden = ad.model.model.language_model.norm(out.hidden_states[layer])[0]  # input of layer K, final norm
    vis = enc.state.visual_positions.cpu()
    after = torch.arange(int(vis.max()) + 1, l1.numel())
    k = enc.n_visual // 2
    expected = dart_rank(l1[vis], l1[after], hidden[vis], hidden[after], k, image_positions=vis,
                         text_positions=after)
    # our prefix computes the same keys and states another way: the comparison is meaningful only if
    # last-bit differences cannot flip a decision, i.e. the rule's result survives 1e-5 relative noise
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        def jit(x):
            return x * (1 + 1e-5 * torch.randn(x.shape, generator=g))
        noisy = dart_rank(jit(l1[vis]), jit(l1[after]), jit(hidden[vis]), jit(hidden[after]), k, image_positions=vis,
                          text_positions=after)
        assert noisy.keep.tolist() == expected.keep.tolist(), "near-tie in the inputs: pick another scene"
    sel = mipruner.select(ad, enc, "dart", k, layer=layer)
    assert sel.keep.tolist() == expected.keep.tolist() and sel.budget == k
    assert sel.extras["pivots_text_positions"].tolist() == after[expected.extras["pivots_text"]].tolist()
    assert sel.extras["visit"].tolist() == expected.extras["visit"].tolist()  # absolute positions, set order
    orig = mipruner.select(ad, enc, "dart", 8, layer=layer, count_rule="original")  # 4 + 8 * floor(8 / 8)
    assert orig.budget == 12 and orig.extras["count_rule"] == "original"


# ------------------------------------------------------------------------------------ cache
def test_budget_rerank_and_generate_reuse_the_prefix(adapters, encoded):
    ad, enc = adapters["qwen2_vl"], encoded["qwen2_vl", "image"]
    with decoder_layer_calls(ad) as calls:
        cache: dict = {}
        a = mipruner.select(ad, enc, "fastv", 4, cache=cache, layer=1)
        assert calls == [1, 0]  # layers 0..K-1 once
        b = mipruner.select(ad, enc, "fastv", 12, cache=cache, layer=1)
        c = mipruner.select(ad, enc, "dart", 0.5, cache=cache, layer=1)
        assert calls == [1, 0]  # re-rank only
        assert set(a.keep.tolist()) <= set(b.keep.tolist()) and c.budget == round(enc.n_visual * 0.5)
        ans = mipruner.answer(ad, enc, b, max_new_tokens=3, min_new_tokens=3, cache=cache)
        assert calls == [1 + 2, 1 + 2]  # prompt: layer 1 only; then 2 decoding steps through both
        assert ans.token_ids == inllm.generate(ad, enc, b, layer=1, max_new_tokens=3, min_new_tokens=3).token_ids
        assert calls == [3 + 3, 3 + 3]  # without the cache: both layers on the prompt, then 2 steps
        mipruner.select(ad, enc, "fastv", 4, cache=cache, layer=2)  # another K: a new prefix
        assert calls == [7, 7]


# ------------------------------------------------------------------------------------ errors
def test_api_and_errors(adapters, encoded):
    ad, enc = adapters["llava"], encoded["llava", "image"]
    assert mipruner.list_pruners("llm") == ["dart", "dycoke", "fastv", "pdrop", "sparsevlm"]
    assert mipruner.get_pruner("fastv").defaults() == {"layer": 2}
    assert mipruner.get_pruner("dart").defaults() == {"layer": 2, "image_pivots": 4, "text_pivots": 4,
                                                      "count_rule": "budget"}
    with pytest.raises(ValueError, match="Did you mean 'fastv'"):
        mipruner.select(ad, enc, "fastvv", 4)
    with pytest.raises(TypeError, match="lam"):
        mipruner.select(ad, enc, "fastv", 4, lam=0.5)
    for bad in (0, 3, 1.5):
        with pytest.raises(ValueError, match="layer"):
            mipruner.select(ad, enc, "fastv", 4, layer=bad)
    with pytest.raises(ValueError, match="layer"):
        inllm.prefill_logits(ad, enc, None, layer=0)
    with pytest.raises(ValueError, match="budget"):
        mipruner.select(ad, enc, "dart", enc.n_visual + 1, layer=1)
    with pytest.raises(ValueError, match="image_pivots"):
        mipruner.select(ad, enc, "dart", 4, layer=1, image_pivots=-1)
    with pytest.raises(ValueError, match="text_pivots"):
        mipruner.select(ad, enc, "dart", 4, layer=1, image_pivots=0, text_pivots=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        inllm.generate(ad, enc, None, layer=1, max_new_tokens=0)
    with pytest.raises(ValueError, match="keep"):
        inllm.generate(ad, enc, [enc.n_visual], layer=1)
    merged = mipruner.Selection(keep=torch.tensor([0, 1]), order=torch.tensor([0, 1]), scores=torch.zeros(16),
                                tokens=enc.visual[:2])
    with pytest.raises(ValueError, match="merged"):
        inllm.prefill_logits(ad, enc, merged, layer=1)
    cache: dict = {}
    mipruner.select(ad, enc, "fastv", 4, cache=cache, layer=1)
    other = ad.encode(scene(56, 56), "Is there a cat?")
    with pytest.raises(ValueError, match="another encoding"):
        mipruner.select(ad, other, "fastv", 4, cache=cache, layer=1)
    dummy = DummyAdapter(patch=8)
    denc = dummy.encode(scene(32, 32), "Is there a white square?")
    with pytest.raises(NotImplementedError, match="dummy"):
        mipruner.select(dummy, denc, "fastv", 4)
