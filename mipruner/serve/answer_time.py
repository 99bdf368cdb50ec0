"""Each answer's own time when several answers share one batched prefill.

`mipruner.answer_batch` / `answer_items` answer their rows as ONE packed prefill and one decoding loop,
so the time measured is the batch's. An answer must not show that time as its own: a 16-frame video's
unpruned row (1,579 LLM tokens) and a pruned row (168 tokens) of one view took the same "prefill".

`split_batch(adapter, answers)` records on each answer of one batched call the rows that shared it
(`Answer.batch_rows`) and the row's share of the prefill's compute (`Answer.prefill_share`): its
prefill FLOPs over the sum of the rows' (`row_prefill_flops`: the row's own tokens through every
layer of the LLM, from the LLM's config). `own_timing(answer)` gives what an answer may show: its
prefill as that share of the batch's prefill, labelled "share of a 6-answer batch's prefill, by
compute", and the decoding loop's time labelled as the batch's (the rows decode together).

A row's prefill FLOPs are `mipruner.measure.compute`'s formula (docs/methods.md, "Compute") for the row's own
tokens through every layer of the LLM: the same for every row, so the shares compare rows of one batch.
"""
from __future__ import annotations

from ..measure.compute import LLMShape
from ..models.base import Answer


def row_prefill_flops(config, n_tokens: int) -> int:
    """Prefill FLOPs of one row of `n_tokens` tokens through the LLM of `config` (mipruner.measure.compute)."""
    return LLMShape.of(config).row_flops(int(n_tokens))


def split_batch(adapter, answers: list[Answer]) -> list[Answer]:
    """Record on the answers of ONE batched call their rows and their prefill shares (in place)."""
    if len(answers) < 2:
        return answers
    flops = [row_prefill_flops(adapter.config, a.input_tokens) for a in answers]
    total = sum(flops)
    for a, f in zip(answers, flops):
        a.batch_rows = len(answers)
        a.prefill_share = f / total if total > 0 else 1.0 / len(answers)
    return answers


def own_timing(answer: Answer) -> dict:
    """What an answer may show as its own: prefill and decode in ms, each with its label."""
    rows = int(getattr(answer, "batch_rows", 1) or 1)
    share = float(getattr(answer, "prefill_share", 1.0))
    if rows < 2:
        return {"prefill_ms": answer.prefill_s * 1e3, "decode_ms": answer.decode_s * 1e3,
                "prefill_label": "", "decode_label": "", "batch_prefill_ms": None}
    return {"prefill_ms": answer.prefill_s * share * 1e3, "decode_ms": answer.decode_s * 1e3,
            "prefill_label": f"share of a {rows}-answer batch's prefill, by compute",
            "decode_label": f"the {rows} answers decode together", "batch_prefill_ms": answer.prefill_s * 1e3}


def timing_line(shown: dict) -> str:
    """'prefill 51 ms (share of ...) · decode 40 ms (...)' from `own_timing`'s keys (as the app's panels show it)."""
    def part(name: str) -> str:
        label = shown.get(f"{name}_label") or ""
        return f"{name} {shown[f'{name}_ms']:.0f} ms" + (f" ({label})" if label else "")

    return f"{part('prefill')} · {part('decode')}"
