"""Several pruned prompts of the LLaVA family decoded as one left-padded batch by `model.generate`.

Each row is exactly what `ProcessorAdapter.generate` feeds for one selection (`pruned_inputs`):
the kept sequence's `inputs_embeds` and its positions, "compact" (0..L_i-1, what `generate`
derives from an all-ones mask) or "original" (each token's position in the unpruned prompt).
Rows of different lengths are left-padded to the longest (or to the next multiple of
`DecodePath.bucket`) with zero embeddings, the pad columns masked out (`attention_mask` 0), and
every row's `position_ids` passed explicitly (pads at 0, never attended); `generate` then
continues each row's positions by last + 1 per new token, as it does unbatched. Rows may come
from different encodings (a batch of items) or from one (several selections of one image).

Where our greedy loop decodes what `generate` would for the arguments (`common/greedy.greedy_supported`),
the rows run through the decoding engine (`common/decode.py`): prefilled as padded batches grouped
by length (`common/rows.py`: no row pays for a much longer row's padding, no (S, S) mask), decoded
as one batch; compiled on `DecodePath(compile=True)` (shapes from a fixed set of buckets). Other
generation arguments, or a generation config that adds logits processors, fall back to the padded
batch through `generate`.

Greedy only (`do_sample=False`). A row that reaches EOS is padded by `generate` while the others
go on; its answer is cut after its first EOS, where its unbatched run stopped. Timings are the
batch's: every row's `prefill_s` / `decode_s` is the whole batch's prefill / decode time.
"""
from __future__ import annotations

import time

import torch

from . import greedy as P
from .path import DecodePath, PrefillTimer, cuda_sync, eos_ids, left_pad, round_up, trim_at_eos
from . import rows as R
from .decode import decode, static_slots
from ..base import Answer, Encoded


def batch_inputs(adapter, rows: list[tuple[Encoded, object]], positions: str | None = None,
                 bucket: int = 0) -> dict:
    """inputs_embeds (B, W, d), attention_mask (B, W), position_ids (B, W) and the real lengths of
    the rows' pruned prompts, left-padded to W = the longest rounded up to `bucket`."""
    ps = [adapter.pruned_inputs(enc, keep, positions) for enc, keep in rows]
    lengths = [int(p["inputs_embeds"].shape[1]) for p in ps]
    width = round_up(max(lengths), bucket)
    embeds, mask = left_pad([p["inputs_embeds"][0] for p in ps], width, 0.0)
    pos_rows = [p["position_ids"][0] if p["position_ids"] is not None
                else torch.arange(n, device=p["inputs_embeds"].device) for p, n in zip(ps, lengths)]
    pos, _ = left_pad(pos_rows, width, 0)
    return dict(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, lengths=lengths)


@torch.no_grad()
def generate_rows(adapter, rows: list[tuple[Encoded, object]], max_new_tokens: int = 64,
                  positions: str | None = None, path: DecodePath | None = None, **gen) -> list[Answer]:
    """Greedy answers of `rows` ((encoding, keep) pairs) as one batch; see the module docstring."""
    from transformers import LogitsProcessorList

    if not rows:
        return []
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    path = path or adapter.decode_path
    gen = dict(gen)
    if gen.pop("do_sample", False):
        raise ValueError("batched decoding is greedy only (do_sample=False)")
    if P.greedy_supported(adapter.model, gen):
        return engine_rows(adapter, rows, max_new_tokens, positions, path, **gen)
    b = batch_inputs(adapter, rows, positions, path.bucket)
    timer = PrefillTimer()
    procs = LogitsProcessorList(list(gen.pop("logits_processor", None) or []) + [timer])
    if adapter.tokenizer.pad_token_id is not None:
        gen.setdefault("pad_token_id", adapter.tokenizer.pad_token_id)
    eos = eos_ids(adapter.model, gen.get("eos_token_id"))
    if path.static_cache:
        width = int(b["inputs_embeds"].shape[1])
        gen.update(cache_implementation="static", max_cache_len=static_slots(width, max_new_tokens, path.bucket))
    gen.setdefault("disable_compile", not path.compile)
    cuda_sync(adapter.device)
    t0 = time.perf_counter()
    out = adapter.model.generate(inputs_embeds=b["inputs_embeds"], attention_mask=b["attention_mask"],
                                 position_ids=b["position_ids"], max_new_tokens=int(max_new_tokens),
                                 do_sample=False, logits_processor=procs, **gen)
    cuda_sync(adapter.device)
    t1 = time.perf_counter()
    first = timer.first if timer.first is not None else t1
    answers = []
    for (enc, _), n, ids in zip(rows, b["lengths"], out.tolist()):  # new tokens only (inputs_embeds input)
        ids = trim_at_eos(ids, eos)
        answers.append(Answer(text=adapter.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                              input_tokens=n, visual_tokens=n - int(enc.text.shape[0]),
                              prefill_s=first - t0, decode_s=t1 - first))
    return answers


def rows_spec(adapter, rows: list[tuple[Encoded, object]], positions: str | None = None) -> R.Rows:
    """The rows for the decoding engine (`common/rows.Rows`): their pruned `inputs_embeds` and positions
    left-padded per group, the model's forward on `inputs_embeds`, each row's next position (its last + 1,
    as `generate` goes on)."""
    ps = [adapter.pruned_inputs(enc, keep, positions) for enc, keep in rows]
    lengths = [int(p["inputs_embeds"].shape[1]) for p in ps]
    embeds = [p["inputs_embeds"][0] for p in ps]
    pos = [p["position_ids"][0] if p["position_ids"] is not None
           else torch.arange(n, device=e.device) for p, n, e in zip(ps, lengths, embeds)]

    def inputs(idx: list[int], width: int) -> dict:
        x, mask = R.left_pad([embeds[i] for i in idx], width, 0.0)
        p, _ = R.left_pad([pos[i] for i in idx], width, 0)
        return dict(inputs_embeds=x, attention_mask=mask, position_ids=p)

    next_pos = torch.stack([p[-1] for p in pos]) + 1
    return R.Rows(lengths=lengths, inputs=inputs, prefill=R.embeds_prefill, next_pos=next_pos,
                  step_positions=lambda at: at[:, None])


@torch.no_grad()
def engine_rows(adapter, rows, max_new_tokens: int, positions: str | None, path: DecodePath, **gen) -> list[Answer]:
    """Greedy answers of `rows` through the decoding engine (module docstring)."""
    gen.pop("disable_compile", None)
    eos = eos_ids(adapter.model, gen.pop("eos_token_id", None))
    procs = list(gen.pop("logits_processor", None) or [])
    min_new = int(gen.pop("min_new_tokens", 0) or 0)
    pad = gen.pop("pad_token_id", None)
    pad = adapter.tokenizer.pad_token_id if pad is None else pad
    pad = eos[0] if pad is None and eos else (pad or 0)
    cuda_sync(adapter.device)
    t0 = time.perf_counter()
    spec = rows_spec(adapter, rows, positions)
    ids, first = decode(adapter, spec, max_new_tokens, path, eos, procs, min_new, pad)
    cuda_sync(adapter.device)
    t1 = time.perf_counter()
    answers = []
    for (enc, _), n, row in zip(rows, spec.lengths, ids):
        row = trim_at_eos(row, eos)
        answers.append(Answer(text=adapter.tokenizer.decode(row, skip_special_tokens=True), token_ids=row,
                              input_tokens=n, visual_tokens=n - int(enc.text.shape[0]),
                              prefill_s=first - t0, decode_s=t1 - first))
    return answers


__all__ = ["batch_inputs", "engine_rows", "generate_rows", "rows_spec"]
