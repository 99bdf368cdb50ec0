"""Several pruned prompts of the LLaVA family decoded as one left-padded batch by `model.generate`.

Each row is exactly what `LlavaFamilyAdapter.generate` feeds for one selection (`pruned_inputs`):
the kept sequence's `inputs_embeds` and its positions, "compact" (0..L_i-1, what `generate`
derives from an all-ones mask) or "original" (each token's position in the unpruned prompt).
Rows of different lengths are left-padded to the longest (or to the next multiple of
`DecodePath.bucket`) with zero embeddings, the pad columns masked out (`attention_mask` 0), and
every row's `position_ids` passed explicitly (pads at 0, never attended); `generate` then
continues each row's positions by last + 1 per new token, as it does unbatched. Rows may come
from different encodings (a batch of items) or from one (several selections of one image).

Without a static cache (the plain path, the app's), and on the compiled path, the rows are PACKED
instead of padded (`_packed.py`): one prefill over the rows' own tokens, the text before the image
once per encoding, then our greedy loop (`_packed.greedy`, what `generate` does for these
arguments): on the plain path in the packed cache itself (`_packed.PackedSteps`: B more positions a
step, nothing copied), on the static path over the rows' caches gathered into a left-padded static
cache. Compiled (`DecodePath(compile=True)`, with a bucket
and a static cache): the packed prefill, its length padded to the bucket, and the decoding step run
through `torch.compile` (`_packed.compiled`; CUDA graphs on CUDA), one graph per bucket and batch
size. The static path without compile keeps the padded batch through `generate`. Generation arguments it does not implement, or a generation config that adds
logits processors, fall back to the padded batch through `generate`.

Greedy only (`do_sample=False`). A row that reaches EOS is padded by `generate` while the others
go on; its answer is cut after its first EOS, where its unbatched run stopped. Timings are the
batch's: every row's `prefill_s` / `decode_s` is the whole batch's prefill / decode time.
"""
from __future__ import annotations

import time

import torch

from . import _packed as P
from ._decode_path import PLAIN, DecodePath, PrefillTimer, cache_length, cuda_sync, eos_ids, left_pad, round_up, trim_at_eos
from .base import Answer, Encoded


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
    path = path or getattr(adapter, "decode_path", PLAIN)
    gen = dict(gen)
    if gen.pop("do_sample", False):
        raise ValueError("batched decoding is greedy only (do_sample=False)")
    if (path.compile or not path.static_cache) and P.packable(adapter.model) and P.greedy_supported(adapter.model, gen):
        return packed_rows(adapter, rows, max_new_tokens, positions, path, **gen)
    b = batch_inputs(adapter, rows, positions, path.bucket)
    timer = PrefillTimer()
    procs = LogitsProcessorList(list(gen.pop("logits_processor", None) or []) + [timer])
    if adapter.tokenizer.pad_token_id is not None:
        gen.setdefault("pad_token_id", adapter.tokenizer.pad_token_id)
    eos = eos_ids(adapter.model, gen.get("eos_token_id"))
    if path.static_cache:
        width = int(b["inputs_embeds"].shape[1])
        gen.update(cache_implementation="static", max_cache_len=cache_length(rows, width, max_new_tokens, path.bucket))
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


def packed_prefill(model, packed: dict):
    """The packed prefill forward (`packed_inputs`): last-token logits (1, B, V) and its cache."""
    out = model(inputs_embeds=packed["inputs_embeds"], attention_mask=packed["attention_mask"],
                position_ids=packed["position_ids"], logits_to_keep=packed["last"], use_cache=True)
    return out.logits, out.past_key_values


def packed_inputs(adapter, rows: list[tuple[Encoded, object]], positions: str | None = None, bucket: int = 0) -> dict:
    """The rows as one packed sequence (`_packed.py`): inputs_embeds (1, S, d), the 4-D block mask,
    position_ids (1, S), `last` (B,), plus the plan, the cache gather index and the rows' lengths."""
    ps = [adapter.pruned_inputs(enc, keep, positions) for enc, keep in rows]
    lengths = [int(p["inputs_embeds"].shape[1]) for p in ps]
    # the text before the first visual token: the same tokens at the same positions in every row
    shared = [int(enc.state["visual_positions"][0]) if enc.n_visual else 0 for enc, _ in rows]
    plan = P.plan(lengths, [id(enc) for enc, _ in rows], shared, bucket)
    device = ps[0]["inputs_embeds"].device
    embeds = P.pack(plan, [p["inputs_embeds"][0] for p in ps], 0.0)
    pos = P.pack(plan, [p["position_ids"][0] if p["position_ids"] is not None
                        else torch.arange(n, device=device) for p, n in zip(ps, lengths)], 0)
    index, real, last = P.gather_index(plan, device)
    mask = P.packed_mask(plan, device, embeds.dtype, P.sdpa(adapter.model))
    next_pos = pos.index_select(0, last) + 1  # each row goes on at its last position + 1, as `generate` does
    return dict(inputs_embeds=embeds[None], attention_mask=mask, position_ids=pos[None], last=last, plan=plan,
                index=index, real=real, lengths=lengths, next_pos=next_pos)


@torch.no_grad()
def packed_rows(adapter, rows, max_new_tokens: int, positions: str | None, path: DecodePath, **gen) -> list[Answer]:
    """Greedy answers of `rows` after one packed prefill (module docstring)."""
    gen.pop("disable_compile", None)
    eos = eos_ids(adapter.model, gen.pop("eos_token_id", None))
    procs = list(gen.pop("logits_processor", None) or [])
    min_new = int(gen.pop("min_new_tokens", 0) or 0)
    pad = gen.pop("pad_token_id", None)
    pad = adapter.tokenizer.pad_token_id if pad is None else pad
    pad = eos[0] if pad is None and eos else (pad or 0)
    cuda_sync(adapter.device)
    t0 = time.perf_counter()
    b = packed_inputs(adapter, rows, positions, path.bucket)
    plan, n_rows = b["plan"], len(rows)
    prefill = P.compiled(adapter, "prefill", packed_prefill) if path.compile else packed_prefill
    logits, packed_cache = prefill(adapter.model, b)
    step_no = [0]
    if not path.static_cache:  # decode on the packed cache itself: B more positions a step (`PackedSteps`)
        steps = P.PackedSteps(P.row_sees(plan, b["attention_mask"], b["last"]), P.sdpa(adapter.model),
                              b["inputs_embeds"].dtype)

        def step(tokens, _):
            pos = (b["next_pos"] + step_no[0])[None, :]
            step_no[0] += 1
            out = adapter.model(input_ids=tokens[None, :], attention_mask=steps.next_mask(), position_ids=pos,
                                past_key_values=packed_cache, use_cache=True)
            return out.logits[0]

        ids, first = P.greedy(step, logits[0], None, max_new_tokens, eos, procs, min_new, pad)
    else:  # every budget of one encoding: one cache size, one compiled step; the rows' caches gathered
        slots = cache_length(rows, plan.width, max_new_tokens, path.bucket)
        cache = P.static_cache(adapter, n_rows, slots)
        P.batched_cache(packed_cache, b["index"], n_rows, plan.width, cache)
        del packed_cache
        model = P.compiled(adapter, "step", adapter.model) if path.compile else adapter.model

        def step(tokens, mask):
            pos = (b["next_pos"] + step_no[0])[:, None]
            step_no[0] += 1
            out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos,
                        past_key_values=cache, use_cache=True)
            return out.logits[:, -1]

        ids, first = P.greedy(step, logits[0], b["real"], max_new_tokens, eos, procs, min_new, pad, slots)
    cuda_sync(adapter.device)
    t1 = time.perf_counter()
    answers = []
    for (enc, _), n, row in zip(rows, b["lengths"], ids):
        row = trim_at_eos(row, eos)
        answers.append(Answer(text=adapter.tokenizer.decode(row, skip_special_tokens=True), token_ids=row,
                              input_tokens=n, visual_tokens=n - int(enc.text.shape[0]),
                              prefill_s=first - t0, decode_s=t1 - first))
    return answers


__all__ = ["batch_inputs", "generate_rows", "packed_inputs", "packed_prefill", "packed_rows"]
