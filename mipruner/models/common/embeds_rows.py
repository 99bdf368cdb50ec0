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

The generation options arrive as one `GenerationConfig` (validated where the request entered), resolved
here against the model once. Greedy only (`do_sample=False`). A row that reaches EOS is padded by `generate` while the others
go on; its answer is cut after its first EOS, where its unbatched run stopped. Timings are the
batch's: every row's `prefill_s` / `decode_s` is the whole batch's prefill / decode time.
"""
from __future__ import annotations

import time

import torch

from . import greedy as P
from . import rows as R
from .generation import GenerationConfig
from .path import DecodePath, PrefillTimer, cuda_sync, left_pad, round_up, trim_at_eos
from .state import static_slots
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
def generate_rows(adapter, rows: list[tuple[Encoded, object]], config: GenerationConfig,
                  positions: str | None = None, path: DecodePath | None = None, procs: tuple = ()) -> list[Answer]:
    """Greedy answers of `rows` ((encoding, keep) pairs) as one batch; see the module docstring. `procs`: the
    logits processors beside the config."""
    from transformers import LogitsProcessorList

    if not rows:
        return []
    path = path or adapter.decode_path
    config = config.resolve(adapter.model, adapter.tokenizer.pad_token_id)
    if P.greedy_supported(adapter.model, config):
        return engine_rows(adapter, rows, config, positions, path, procs)
    b = batch_inputs(adapter, rows, positions, path.bucket)
    timer = PrefillTimer()
    gen = config.generate_kwargs()
    procs = LogitsProcessorList(list(procs) + [timer])
    if path.static_cache:
        width = int(b["inputs_embeds"].shape[1])
        gen.update(cache_implementation="static",
                   max_cache_len=static_slots(width, config.max_new_tokens, path.bucket))
    gen.setdefault("disable_compile", not path.compile)
    cuda_sync(adapter.device)
    t0 = time.perf_counter()
    out = adapter.model.generate(inputs_embeds=b["inputs_embeds"], attention_mask=b["attention_mask"],
                                 position_ids=b["position_ids"], logits_processor=procs, **gen)
    cuda_sync(adapter.device)
    t1 = time.perf_counter()
    first = timer.first if timer.first is not None else t1
    return _answers(adapter, rows, b["lengths"], out.tolist(), config.eos, first - t0, t1 - first)


def _answers(adapter, rows, lengths, token_rows, eos, prefill_s: float, decode_s: float) -> list[Answer]:
    """Each row's answer: its tokens cut after the first EOS, the batch's timings."""
    answers = []
    for (enc, _), n, ids in zip(rows, lengths, token_rows):  # new tokens only (inputs_embeds input)
        ids = trim_at_eos(ids, eos)
        answers.append(Answer(text=adapter.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                              input_tokens=n, visual_tokens=n - int(enc.text.shape[0]),
                              prefill_s=prefill_s, decode_s=decode_s))
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
def engine_rows(adapter, rows, config: GenerationConfig, positions: str | None, path: DecodePath,
                procs: tuple = ()) -> list[Answer]:
    """Greedy answers of `rows` through the decoding engine (module docstring)."""
    config = config.resolve(adapter.model, adapter.tokenizer.pad_token_id)  # as it is when already resolved
    cuda_sync(adapter.device)
    t0 = time.perf_counter()
    spec = rows_spec(adapter, rows, positions)
    ids, first = adapter.decoder.decode(spec, config, path, procs)
    cuda_sync(adapter.device)
    t1 = time.perf_counter()
    return _answers(adapter, rows, spec.lengths, ids, config.eos, first - t0, t1 - first)


__all__ = ["batch_inputs", "engine_rows", "generate_rows", "rows_spec"]
