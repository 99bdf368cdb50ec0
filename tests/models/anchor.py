"""The keep-all anchor and the masked-prune equality, stated once for every family
(tests/models/test_family_contract.py runs them on each row of the family table)."""
from __future__ import annotations

import torch

from mipruner.models.common.request import ProcessorState, QwenState

# Families whose keep-all logits match the model's own forward within 1e-5 rather than bit for bit.
ANCHOR_ATOL = {"llava_onevision": 1e-5, "internvl": 1e-5}


def reference_inputs(e) -> dict:
    """The model's own inputs for an encoding: transformers' processor output kept in state.ref (LLaVA
    line, OneVision, InternVL), or the Qwen adapters' ids, vision inputs and M-RoPE arguments."""
    st = e.state
    if isinstance(st, ProcessorState):
        return st.ref
    return dict(input_ids=st.input_ids, mm_token_type_ids=st.mm_token_type_ids, **st.vision_inputs,
                **st.rope_kwargs)


def _same(got, want, atol: float) -> None:
    if atol:
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    else:
        assert torch.equal(got, want)


def assert_keep_all_is_the_unpruned_model(a, e):
    """Every visual token kept = the model's own input ids, logits (bit for bit, or ANCHOR_ATOL) and greedy
    tokens, one by one and in a batch next to a pruned row."""
    ref_inputs = reference_inputs(e)
    ids = ref_inputs["input_ids"]
    atol = ANCHOR_ATOL.get(a.family, 0.0)
    assert torch.equal(e.state.input_ids.reshape(1, -1).cpu(), ids.reshape(1, -1).cpu())
    ref = a.model(**ref_inputs).logits[0].float()
    _same(a.prefill_logits(e), ref, atol)
    _same(a.prefill_logits(e, keep=torch.arange(e.n_visual)), ref, atol)
    plain = a.model.generate(**ref_inputs, do_sample=False, max_new_tokens=6)
    ans = a.generate(e, max_new_tokens=6)
    assert ans.token_ids == plain[0, ids.shape[1]:].tolist()
    assert ans.input_tokens == ids.shape[1] and ans.visual_tokens == e.n_visual
    assert ans.prefill_s > 0 and ans.decode_s >= 0
    batch = a.generate_batch([(e, None), (e, torch.arange(0, e.n_visual, 2))], max_new_tokens=6)
    assert batch[0].token_ids == ans.token_ids


def masked_reference(a, e, seq_keep: torch.Tensor) -> torch.Tensor:
    """The model's own forward over the full sequence, dropped visual tokens hidden from attention, at
    the kept rows. M-RoPE (Qwen): explicit positions and a 4D mask (a dropped query attends to itself
    only, never read); otherwise the 2D attention mask."""
    L = seq_keep.numel()
    if isinstance(e.state, QwenState):
        allowed = torch.tril(torch.ones(L, L, dtype=torch.bool)) & seq_keep[None, :]
        allowed |= torch.eye(L, dtype=torch.bool)
        out = a.model(**reference_inputs(e), position_ids=e.state.positions, attention_mask=allowed[None, None])
    else:
        out = a.model(**dict(reference_inputs(e), attention_mask=seq_keep[None].long()))
    return out.logits[0, seq_keep].float()


def assert_pruned_equals_masked_full_sequence(a, e):
    """A pruned prefill (original positions) = the model's own forward with the dropped tokens hidden."""
    k = max(1, e.n_visual // 4)
    keep = torch.randperm(e.n_visual, generator=torch.Generator().manual_seed(1))[:k].sort().values
    L = e.state.input_ids.numel()
    dropped = e.state.visual_positions[torch.isin(torch.arange(e.n_visual), keep, invert=True)]
    seq_keep = torch.ones(L, dtype=torch.bool)
    seq_keep[dropped] = False
    if isinstance(e.state, QwenState):  # Qwen keeps the original M-RoPE positions
        pruned = a.prefill_logits(e, keep=keep)
        tol = dict(atol=1e-5, rtol=1e-5)
    else:
        pruned = a.prefill_logits(e, keep=keep, positions="original")
        assert a.prefill_logits(e, keep=keep).shape == pruned.shape  # default: compact positions 0..L'-1
        tol = dict(atol=1e-5, rtol=0)
    assert pruned.shape[0] == L - (e.n_visual - k)
    torch.testing.assert_close(pruned, masked_reference(a, e, seq_keep), **tol)
    ans = a.generate(e, keep=keep, max_new_tokens=3)
    assert ans.input_tokens == L - (e.n_visual - k) and ans.visual_tokens == k
    assert 1 <= len(ans.token_ids) <= 3
