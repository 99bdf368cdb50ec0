"""The keep-all anchor and the masked-prune equality for adapters that keep transformers' own inputs
in `Encoded.state["ref"]` (LLaVA-OneVision, InternVL): one statement of each, every family's test calls it."""
from __future__ import annotations

import torch


def assert_keep_all_is_the_unpruned_model(a, e):
    """Every visual token kept = the model's own input ids, logits (1e-5) and greedy tokens, one by one
    and in a batch next to a pruned row."""
    ref_inputs = e.state["ref"]
    assert torch.equal(e.state["input_ids"].cpu(), ref_inputs["input_ids"][0])
    ref = a.model(**ref_inputs).logits[0].float()
    torch.testing.assert_close(a.prefill_logits(e), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.prefill_logits(e, keep=torch.arange(e.n_visual)), ref, atol=1e-5, rtol=0)
    plain = a.model.generate(**ref_inputs, do_sample=False, max_new_tokens=6)
    ans = a.generate(e, max_new_tokens=6)
    assert ans.token_ids == plain[0, ref_inputs["input_ids"].shape[1]:].tolist()
    assert ans.visual_tokens == e.n_visual
    batch = a.generate_batch([(e, None), (e, torch.arange(0, e.n_visual, 2))], max_new_tokens=6)
    assert batch[0].token_ids == ans.token_ids


def assert_pruned_equals_masked_full_sequence(a, e):
    """A pruned prefill (original positions) = the model's own forward with the dropped tokens masked."""
    k = max(1, e.n_visual // 4)
    keep = torch.randperm(e.n_visual, generator=torch.Generator().manual_seed(1))[:k].sort().values
    L = e.state["input_ids"].numel()
    pruned = a.prefill_logits(e, keep=keep, positions="original")
    assert pruned.shape[0] == L - (e.n_visual - k)
    vpos = e.state["visual_positions"]
    dropped = vpos[torch.isin(torch.arange(e.n_visual), keep, invert=True)]
    mask = torch.ones(1, L, dtype=torch.long)
    mask[0, dropped] = 0
    full = a.model(**dict(e.state["ref"], attention_mask=mask)).logits[0].float()
    kept = torch.ones(L, dtype=torch.bool)
    kept[dropped] = False
    torch.testing.assert_close(pruned, full[kept], atol=1e-5, rtol=0)
    assert a.generate(e, keep=keep, max_new_tokens=3).visual_tokens == k
