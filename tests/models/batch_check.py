"""What the batch tests share: the one-by-one reference with its per-step logit margins, and the
tie rule for comparing greedy tokens.

Tie rule: a batched (left-padded, masked) forward is not bit-identical to an unbatched one, so where
the one-by-one run's top-2 logits at a step are within MARGIN of each other, the batched run may
pick the other token and every later step may differ. Tokens are compared at every step BEFORE the
first such step (all steps when there is none, lengths included); `compare` returns how many steps
were compared, and the tests require most steps to be, so the check cannot pass vacuously. The
logits themselves are compared too (`check_logits`, to 1e-5), at every step up to that one.
"""
from __future__ import annotations

import torch

MARGIN = 1e-4


class Scores:
    """A logits processor keeping every step's scores, (B, V) per step (B = 1 for an unbatched run),
    and for one row its top-2 margins."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores.detach().float().cpu().clone())
        return scores

    @property
    def first(self) -> torch.Tensor:
        """The first step's scores: the prefill's last row (row 0 of an unbatched run: (V,))."""
        return self.steps[0][0] if self.steps[0].shape[0] == 1 else self.steps[0]

    @property
    def margins(self) -> list[float]:
        tops = [s[0].topk(2).values for s in self.steps]
        return [float(t[0] - t[1]) for t in tops]


def tie_step(margins: list[float]) -> int | None:
    return next((i for i, m in enumerate(margins) if m <= MARGIN), None)


def check_logits(batched: Scores, reference, atol: float = 1e-5) -> None:
    """Every batched row's logits at every step up to its first near-tie (inclusive: its inputs are
    still the same there) equal its one-by-one run's up to float rounding: the rows, masks,
    prefill positions and decoding positions each row sees are its own."""
    for i, (_, rec) in enumerate(reference):
        tie = tie_step(rec.margins)
        n = len(rec.steps) if tie is None else tie + 1
        for t in range(n):
            torch.testing.assert_close(batched.steps[t][i], rec.steps[t][0], atol=atol, rtol=0,
                                       msg=lambda m: f"row {i} step {t}: {m}")


def one_by_one(adapter, encoded, selections, max_new_tokens: int, **gen):
    """[(Answer, Scores)] of the unbatched `adapter.generate` for each selection."""
    out = []
    for s in selections:
        rec = Scores()
        ans = adapter.generate(encoded, keep=s, max_new_tokens=max_new_tokens,
                               logits_processor=[rec], **gen)
        out.append((ans, rec))
    return out


def compare(batched_ids: list[int], ref_ids: list[int], margins: list[float]) -> int:
    """Assert the tie rule (module docstring); returns the number of steps compared."""
    tie = tie_step(margins)
    if tie is None:
        assert batched_ids == ref_ids, (batched_ids, ref_ids)
        return len(ref_ids)
    assert batched_ids[:tie] == ref_ids[:tie], (batched_ids, ref_ids, tie)
    return tie


def compare_all(batched, reference) -> tuple[int, int]:
    """(steps compared, steps in all) over rows; Answers vs [(Answer, Scores)]."""
    done = total = 0
    for b, (ref, rec) in zip(batched, reference):
        done += compare(b.token_ids, ref.token_ids, rec.margins)
        total += len(ref.token_ids)
        assert b.input_tokens == ref.input_tokens and b.visual_tokens == ref.visual_tokens
    return done, total


def assert_selections_batch_equals_one_by_one(a, e, positions: str, min_share: float = 0.5) -> None:
    """Several selections of one encoding (none, MI, VisionZip, 1 token, all but one) as one left-padded
    batch give the one-by-one answers (the tie rule), tokens compared on at least `min_share` of the steps;
    the GPU path (bucketed lengths, static cache) keeps the keep-all answer."""
    import mipruner
    from mipruner.serve.batch import answer_batch, use_decode_path

    n = e.n_visual
    g = torch.Generator().manual_seed(3)
    sels = [None, mipruner.select(a, e, "mi", max(1, n // 4), lam=0.5),
            mipruner.select(a, e, "visionzip", max(2, n // 3))]
    sels += [torch.randperm(n, generator=g)[:k] for k in (1, n - 1)]
    ref = one_by_one(a, e, sels, 6, positions=positions)
    scores = Scores()
    got = answer_batch(a, e, sels, max_new_tokens=6, positions=positions, logits_processor=[scores])
    check_logits(scores, ref)
    done, total = compare_all(got, ref)
    assert done >= min_share * total, (done, total)  # tokens compared up to each row's first near-tie
    try:
        use_decode_path(a, bucket=16, static_cache=True)
        assert a.generate(e, max_new_tokens=6, positions=positions).token_ids == ref[0][0].token_ids
    finally:
        a.use_decode_path()
