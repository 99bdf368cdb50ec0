"""The in-LLM API's pre-LLM step (`run.at(0)`) and decode-time stage (`run.decode`) as a plug-in author uses
them, on the embedded model (3 decoder layers):

  decode only   a method with no prefill stage and a decode-time stage attending to every token answers as
                the unpruned model, token for token, and reports every visual key read at every step;
  masked        a stage hiding the same tokens at every step from layer 1 on answers as a reference that
                runs the model's layers with those keys masked (-inf) at every step from layer 1 on, and its
                state persists across steps;
  layer 0       `run.at(0)` drops rows before any layer: the answer of keeping all through it is unpruned;
  misuse        attention at layer 0, two decode stages, a mask of the wrong shape: one sentence each.
"""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner import Selection
from mipruner.inllm import DecoderRun, register_inllm


def _all(run):
    return Selection.from_order(torch.arange(run.n_visual), torch.zeros(run.n_visual))


def test_a_decode_only_method_keeping_all_is_unpruned(model, registered):
    ad, enc = model

    @register_inllm("watch", label="Watch")
    def watch(run: DecoderRun, budget: int) -> Selection:
        run.decode(1, lambda step: None)
        return _all(run)

    registered.append("watch")
    with torch.no_grad():
        sel = mipruner.select(ad, enc, "watch", enc.n_visual)
        assert sel.extras["stages"] == () and sel.extras["decode"].layer == 1
        got = mipruner.answer(ad, enc, sel, max_new_tokens=5, min_new_tokens=5)
        ref = ad.generate(enc, max_new_tokens=5, min_new_tokens=5)
    assert got.token_ids == ref.token_ids
    assert list(got.decode_visual) == [enc.n_visual] * 4


def _masked_reference(ad, enc, hidden: torch.Tensor, layer: int, n: int) -> list[int]:
    """Greedy tokens with the visual tokens `hidden` (bool (N_V,)) masked as keys from `layer` on at every
    decoding step (not at prefill), the layers called one by one on a stock DynamicCache; EOS masked."""
    from transformers import DynamicCache

    from mipruner.inllm._prompt import prompt_of

    p = prompt_of(ad, enc)
    lm = p.lm
    cache = DynamicCache(config=lm.config)
    h = p.embeds
    pe = lm.rotary_emb(h, p.rope_positions)
    for block in lm.layers:
        h = block(h, attention_mask=None, position_embeddings=pe, position_ids=p.layer_positions,
                  past_key_values=cache)
    def pick(logits):  # EOS masked: n tokens forced (min_new_tokens = n)
        logits = logits.float().clone()
        logits[list(p.eos)] = float("-inf")
        return int(logits.argmax())

    tokens = [pick(p.head(lm.norm(h))[0, -1])]
    for t in range(1, n):
        x = lm.embed_tokens(torch.tensor([[tokens[-1]]]))
        r = torch.full((*p.rope_positions.shape[:-1], 1), p.next_position + t - 1, dtype=torch.long)
        pe = lm.rotary_emb(x, r)
        mask = torch.zeros(1, 1, 1, p.length + t, dtype=x.dtype)
        mask[..., p.visual_positions[hidden]] = float("-inf")
        for i, block in enumerate(lm.layers):
            x = block(x, attention_mask=mask if i >= layer else None, position_embeddings=pe,
                      position_ids=None if p.layer_positions is None else r.view(1, 1), past_key_values=cache)
        tokens.append(pick(p.head(lm.norm(x))[0, -1]))
    return tokens


def test_a_masking_stage_equals_masking_the_keys(model, registered):
    ad, enc = model
    seen = []

    @register_inllm("everyother", label="Every other")
    def everyother(run: DecoderRun, budget: int) -> Selection:
        def stage(step):
            step.memory["n"] = step.memory.get("n", 0) + 1
            seen.append((step.index, step.memory["n"], float(step.attention().sum())))
            keep = torch.zeros(run.n_visual, dtype=torch.bool)
            keep[::2] = True
            return keep

        run.decode(1, stage)
        return _all(run)

    registered.append("everyother")
    with torch.no_grad():
        sel = mipruner.select(ad, enc, "everyother", enc.n_visual)
        got = mipruner.answer(ad, enc, sel, max_new_tokens=6, min_new_tokens=6)
        hidden = torch.ones(enc.n_visual, dtype=torch.bool)
        hidden[::2] = False
        want = _masked_reference(ad, enc, hidden, 1, 6)
    assert got.token_ids == want
    assert want != ad.generate(enc, max_new_tokens=6, min_new_tokens=6).token_ids  # the masking changes the answer
    assert list(got.decode_visual) == [int((~hidden).sum())] * 5
    assert [(i, k) for i, k, _ in seen] == [(i, i) for i in range(1, 6)]  # one call a step, state kept
    assert all(0 < s < 1 for _, _, s in seen)  # a share of the row's probabilities: the visual keys'
    assert all(not layer.self_attn._forward_pre_hooks for layer in ad.text_decoder().layers)


def test_layer_0_keeping_all_is_unpruned_and_misuse(model, registered):
    ad, enc = model

    @register_inllm("zero", label="Zero", params=())
    def zero(run: DecoderRun, budget: int) -> Selection:
        view = run.at(0)
        assert torch.equal(view.hidden(run.visual_positions), run.embeddings(run.visual_positions))
        run.keep(view, view.visual)
        view = run.at(2)
        run.keep(view, view.visual)
        return _all(run)

    @register_inllm("bad0", label="Bad 0")
    def bad0(run: DecoderRun, budget: int) -> Selection:
        run.at(0).attention("last")

    @register_inllm("twice", label="Twice")
    def twice(run: DecoderRun, budget: int) -> Selection:
        run.decode(1, lambda s: None)
        run.decode(2, lambda s: None)

    @register_inllm("shape", label="Shape")
    def shape(run: DecoderRun, budget: int) -> Selection:
        run.decode(1, lambda s: torch.ones(3, dtype=torch.bool))
        return _all(run)

    registered.extend(["zero", "bad0", "twice", "shape"])
    with torch.no_grad():
        sel = mipruner.select(ad, enc, "zero", enc.n_visual)
        assert [s.layer for s in sel.extras["stages"]] == [0, 2]
        assert mipruner.answer(ad, enc, sel, max_new_tokens=4).token_ids == ad.generate(enc, max_new_tokens=4).token_ids
        with pytest.raises(ValueError, match="layer 0 .* reads no attention"):
            mipruner.select(ad, enc, "bad0", enc.n_visual)
        with pytest.raises(ValueError, match="run.decode is called once"):
            mipruner.select(ad, enc, "twice", enc.n_visual)
        sel = mipruner.select(ad, enc, "shape", enc.n_visual)
        with pytest.raises(ValueError, match=r"returns an \(\d+,\) bool mask"):
            mipruner.answer(ad, enc, sel, max_new_tokens=4, min_new_tokens=4)
