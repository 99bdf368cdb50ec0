"""Several pruned prompts of the Qwen-VL family decoded as one left-padded batch by a greedy loop.

Each row is exactly what `Qwen2VLAdapter.generate` feeds for one selection (`_llm_inputs`): the
pruned `input_ids`, the M-RoPE positions computed once on the row's UNPRUNED sequence and
gathered at its kept columns, and its kept visual rows (Qwen3-VL: with the same rows of every
deepstack tensor). The rows are left-padded to the longest (or to the next multiple of
`DecodePath.bucket`) with the pad token, the pad columns masked out (`attention_mask` 0) and
their positions 0 (never attended); the visual rows of all rows go, in row order, into one
`mm_encoder_outputs` entry per modality (the model scatters them into the placeholders in
row-major order, which is the same order), and likewise each deepstack layer's rows.

With a static cache the attention mask has the cache's width from the prefill on (zeros for the
slots not written yet, one more set per step), as `generate` gives its compiled step a mask of
the cache's size: a mask growing by one column a step would be a new input shape every step, and
a step compiled with `dynamic=False` would recompile at each one.

Without a static cache (the plain path, the app's) the prefill is PACKED instead of padded
(`_packed.py`): one sequence of the rows' own tokens, the text before the image once per encoding
(the same ids at the same M-RoPE positions in every row), the visual rows merged in packed order;
the loop then decodes in the packed cache itself (`_packed.PackedSteps`: each step's B tokens are B
more positions, each seeing its own row), with nothing gathered.
On the compiled path (`DecodePath(compile=True)`, with a bucket and a static cache) the prefill is
packed too, its length padded to the bucket, and runs through `_packed.compiled` with the visual rows
placed before the compiled forward (`prefill.py`: one graph per bucket and batch size, whatever the
kept counts); the decoding step is compiled the same way (CUDA graphs on CUDA; off CUDA only when
`_packed.COMPILE` names a backend).

Decoding continues every row at ITS unpruned max position + 1 (`next_position`: rows of
different encodings have different starts, and `rope_deltas` is never used because positions are
always passed). Finished rows are fed the pad token, as `generate` does; the loop stops when every
row has reached EOS (one host sync per step, as `generate`'s stopping check) or after
`max_new_tokens`. `logits_processor`: callables (generated ids (B, t), scores (B, V)) -> scores,
applied before the argmax. Timings are the batch's (every row gets the batch's prefill / decode).
"""
from __future__ import annotations

import time

import torch

from .. import _packed as P
from .._decode_path import PLAIN, DecodePath, cache_length, eos_ids, left_pad, round_up, trim_at_eos
from ..base import Answer, Encoded, keep_indices
from .prefill import packed_embeds, packed_prefill


def _merge_outputs(outs: list):
    """One encoder output from several rows' outputs (pooler rows and deepstack rows in row order)."""
    first = outs[0]
    pooled = tuple(t for o in outs for t in o.pooler_output)
    deep = getattr(first, "deepstack_features", None)
    if deep is None:
        return type(first)(pooler_output=pooled)
    layers = [tuple(t for o in outs for t in o.deepstack_features[i]) for i in range(len(deep))]
    return type(first)(pooler_output=pooled, deepstack_features=layers)


def batch_inputs(adapter, rows: list[tuple[Encoded, object]], bucket: int = 0) -> dict:
    """input_ids (B, W), position_ids (3, B, W), attention_mask (B, W), mm_encoder_outputs, the real
    lengths and each row's first decoding position (B,), left-padded to W = longest rounded up."""
    ins = [adapter._llm_inputs(enc, keep) for enc, keep in rows]
    lengths = [int(x["input_ids"].shape[1]) for x in ins]
    width = round_up(max(lengths), bucket)
    pad = adapter.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    if pad in (adapter.config.image_token_id, adapter.config.video_token_id):
        raise ValueError("the pad token is a visual placeholder: cannot left-pad")
    ids, mask = left_pad([x["input_ids"][0] for x in ins], width, pad)
    pos, _ = left_pad([x["position_ids"][:, 0].T for x in ins], width, 0)  # (B, W, 3)
    by_modality: dict = {}
    for x in ins:
        for modality, out in x["mm_encoder_outputs"].items():
            by_modality.setdefault(modality, []).append(out)
    device = ids.device
    starts = torch.tensor([adapter.next_position(enc) for enc, _ in rows], dtype=torch.long, device=device)
    return dict(input_ids=ids, attention_mask=mask, position_ids=pos.permute(2, 0, 1).contiguous(),
                mm_encoder_outputs={m: _merge_outputs(o) for m, o in by_modality.items()},
                lengths=lengths, starts=starts, pad=pad, inputs=ins)


def packed_inputs(adapter, rows: list[tuple[Encoded, object]], ins: list[dict], bucket: int = 0) -> dict:
    """The rows (their `_llm_inputs`, `ins`) as one packed sequence (`_packed.py`): input_ids (1, S),
    position_ids (3, 1, S), the 4-D block mask, mm_encoder_outputs in packed order, `last` (B,), the
    plan and the cache gather index."""
    lengths = [int(x["input_ids"].shape[1]) for x in ins]
    shared = [int(enc.state["visual_positions"][0]) for enc, _ in rows]  # the text before the first visual token
    plan = P.plan(lengths, [id(enc) for enc, _ in rows], shared, bucket)
    pad = adapter.tokenizer.pad_token_id
    ids = P.pack(plan, [x["input_ids"][0] for x in ins], 0 if pad is None else int(pad))
    pos = P.pack(plan, [x["position_ids"][:, 0].T for x in ins], 0).T.unsqueeze(1).contiguous()  # (3, 1, S)
    by_modality: dict = {}
    for i in [i for i, _, stop in plan.pieces if stop == lengths[i]]:  # the rows' own pieces (with their visual rows)
        for modality, out in ins[i]["mm_encoder_outputs"].items():
            by_modality.setdefault(modality, []).append(out)
    device = ids.device
    index, real, last = P.gather_index(plan, device)
    mask = P.packed_mask(plan, device, adapter.model.dtype, P.sdpa(adapter.model))
    return dict(input_ids=ids[None], position_ids=pos, attention_mask=mask, last=last, plan=plan, index=index,
                real=real, mm_encoder_outputs={m: _merge_outputs(o) for m, o in by_modality.items()})


def _cache(adapter, path: DecodePath, batch: int, length: int):
    """A DynamicCache, or a StaticCache of `length` slots (`_packed.static_cache`: kept on the adapter
    per shape, so a compiled step sees the same buffers)."""
    from transformers import DynamicCache

    if not path.static_cache:
        return DynamicCache(config=adapter.model.config.get_text_config())
    return P.static_cache(adapter, batch, length)


def _step_fn(adapter, path: DecodePath):
    """The decoding-step forward: the model itself, or compiled (`_packed.compiled`, kept on the adapter)."""
    return P.compiled(adapter, "step", adapter.model) if path.compile else adapter.model


@torch.no_grad()
def generate_rows(adapter, rows: list[tuple[Encoded, object]], max_new_tokens: int = 64,
                  path: DecodePath | None = None, **gen) -> list[Answer]:
    """Greedy answers of `rows` ((encoding, keep) pairs) as one batch; see the module docstring."""
    if not rows:
        return []
    path = path or getattr(adapter, "decode_path", PLAIN)
    gen = dict(gen)
    if gen.pop("do_sample", False):
        raise ValueError("only greedy decoding is supported (do_sample=False)")
    eos = eos_ids(adapter.model, gen.pop("eos_token_id", None))
    procs = list(gen.pop("logits_processor", None) or [])
    if gen:
        raise ValueError(f"unsupported generation arguments: {sorted(gen)}; supported: max_new_tokens, "
                         f"eos_token_id, do_sample=False, logits_processor")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    b = batch_inputs(adapter, rows, path.bucket)
    starts = b["starts"]
    if int(starts.max()) + max_new_tokens > adapter._max_positions():
        raise ValueError(f"prompt ({int(starts.max())} positions) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's context {adapter._max_positions()}")
    ids, mask = b["input_ids"], b["attention_mask"]
    n_rows, width = ids.shape
    device = ids.device
    slots = cache_length(rows, width, max_new_tokens, path.bucket)
    cache = _cache(adapter, path, n_rows, slots)
    if path.static_cache:  # one mask of the cache's width for every step: a compiled step sees one shape
        mask = torch.cat([mask, mask.new_zeros(n_rows, slots - width)], dim=1)
    eos_t = torch.tensor(eos, dtype=torch.long, device=device)
    pad = ids.new_full((n_rows,), b["pad"])

    def pick(logits, generated):
        scores = logits.float()
        for p in procs:
            scores = p(generated, scores)
        return scores.argmax(-1)

    t0 = time.perf_counter()
    steps = None  # the packed steps (`_packed.PackedSteps`) when the rows decode in the packed cache
    if path.compile and P.packable(adapter.model):  # the compiled packed prefill at the bucketed length
        pk = packed_inputs(adapter, rows, b["inputs"], path.bucket)
        logits, packed_cache = P.compiled(adapter, "prefill", packed_prefill)(adapter.model, packed_embeds(adapter, pk))
        P.batched_cache(packed_cache, pk["index"], n_rows, width, cache)
        del packed_cache
        first = logits[0]
    elif not path.static_cache and P.packable(adapter.model):  # one packed prefill, decoded in its own cache
        pk = packed_inputs(adapter, rows, b["inputs"], path.bucket)
        out = adapter.model(input_ids=pk["input_ids"], position_ids=pk["position_ids"],
                            attention_mask=pk["attention_mask"], mm_encoder_outputs=pk["mm_encoder_outputs"],
                            use_cache=True, logits_to_keep=pk["last"])
        cache, first = out.past_key_values, out.logits[0]
        steps = P.PackedSteps(P.row_sees(pk["plan"], pk["attention_mask"], pk["last"]), P.sdpa(adapter.model),
                              adapter.model.dtype)
    else:
        out = adapter.model(input_ids=ids, position_ids=b["position_ids"], attention_mask=mask,
                            mm_encoder_outputs=b["mm_encoder_outputs"], past_key_values=cache, use_cache=True,
                            logits_to_keep=1)
        first = out.logits[:, -1]
    token = pick(first, ids.new_zeros(n_rows, 0))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    tokens = [token]
    done = torch.isin(token, eos_t)
    step_fn = _step_fn(adapter, path)
    for step in range(1, int(max_new_tokens)):
        if eos and bool(done.all()):
            break
        fed = torch.where(done, pad, token)
        if steps is not None:  # the B rows' tokens as B more positions of the packed sequence
            pos = (starts + (step - 1)).view(1, 1, n_rows).expand(3, 1, n_rows)
            out = step_fn(input_ids=fed[None, :], position_ids=pos, attention_mask=steps.next_mask(),
                          past_key_values=cache, use_cache=True)
            logits = out.logits[0]
        else:
            if path.static_cache:
                mask[:, width + step - 1] = 1  # the slot the previous token was written to
            else:
                mask = torch.cat([mask, mask.new_ones(n_rows, 1)], dim=1)
            pos = (starts + (step - 1)).view(1, n_rows, 1).expand(3, n_rows, 1)
            out = step_fn(input_ids=fed[:, None], position_ids=pos, attention_mask=mask, past_key_values=cache,
                          use_cache=True)
            logits = out.logits[:, -1]
        token = torch.where(done, pad, pick(logits, torch.stack(tokens, 1)))
        tokens.append(token)
        done = done | torch.isin(token, eos_t)
    all_ids = torch.stack(tokens, 1).tolist()  # one transfer after the loop
    t2 = time.perf_counter()
    answers = []
    for (enc, keep), n, row in zip(rows, b["lengths"], all_ids):
        row = trim_at_eos(row, eos)
        n_vis = enc.n_visual if keep is None else int(keep_indices(keep, enc.n_visual).numel())
        answers.append(Answer(text=adapter.tokenizer.decode(row, skip_special_tokens=True), token_ids=row,
                              input_tokens=n, visual_tokens=n_vis, prefill_s=t1 - t0, decode_s=t2 - t1))
    return answers


__all__ = ["batch_inputs", "generate_rows"]
