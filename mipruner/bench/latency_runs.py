"""The runs of `bench latency`: one call each, what a user waits for, its parts marked on the device.

Every run takes (image, prompt) so that the runs of one cell see varied inputs, and returns its marks:
`total_ms` (from the request's start: the processor or our encode included), `ttft_ms` (to the first
token's logits: a LogitsProcessor marks its first call, which comes right after the prefill forward),
`decode_ms_per_token` ((end - first mark) / (new tokens - 1)), the prompt's LLM tokens and the new tokens,
and the parts between their own marks: `encode_ms` (start to encoded), `select_ms` (encoded to selected:
the selection alone, not the encode before it).
On CUDA the marks are CUDA events recorded on the current stream (read after one synchronize at the
run's end); elsewhere `time.perf_counter`. Runs:
  plain     transformers: the processor, then `model.generate` of the unpruned model (eager: its
            dynamic cache; `static`: `cache_implementation="static"`, which transformers compiles on CUDA)
  ours      `adapter.encode` -> `mipruner.select` (cold cache) -> `mipruner.answer` (or the unpruned answer)
  batch     B items: `encode_items` (one tower call where the family batches it), B selections,
            `answer_items` as one batch (the marks are the batch's)
  view      one cached encoding: the app's six answers of one view in one `answer_batch` (the unpruned one
            and the pruned rows), or the unpruned answer alone
  encode    `encode_items` of B images only
Answers are exactly `n` tokens long (EOS masked until then: `adapter.fixed_length_kwargs`).
"""
from __future__ import annotations

import time

import torch
from transformers import LogitsProcessorList

import mipruner
from mipruner.serve.batch import answer_batch, answer_items, encode_items


class Clock:
    """Marks on the device's timeline: CUDA events on CUDA, perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


class FirstLogits:
    """A LogitsProcessor that marks its first call (the prefill's logits are ready on the stream)."""

    def __init__(self, clock: Clock):
        self.clock, self.first = clock, None

    def __call__(self, input_ids, scores):
        if self.first is None:
            self.first = self.clock.mark()
        return scores


def _result(clock: Clock, t0, first, t1, n: int, prompt_tokens: int, new_tokens: int, **parts) -> dict:
    clock.sync()
    total = clock.ms(t0, t1)
    ttft = clock.ms(t0, first) if first is not None else None
    per = (clock.ms(first, t1) / (n - 1)) if first is not None and n > 1 else None
    out = {"total_ms": total, "ttft_ms": ttft, "decode_ms_per_token": per, "prompt_tokens": prompt_tokens,
           "new_tokens": new_tokens}
    out.update({k: clock.ms(a, b) for k, (a, b) in parts.items()})  # each part between its own two marks
    return out


def plain(adapter, clock: Clock, n: int, batch: int = 1, static: bool = False):
    """processor + `model.generate` of B copies of the prompt (transformers' own pipeline)."""
    from mipruner.models.common.hf_adapter import chat_prompt

    extra = {"cache_implementation": "static"} if static else {}

    def run(image, prompt):
        first = FirstLogits(clock)
        t0 = clock.mark()
        text = chat_prompt(adapter.processor, prompt, "image", fallback="USER: <image>\n{prompt} ASSISTANT:")
        inputs = adapter.processor(images=[image] * batch, text=[text] * batch, return_tensors="pt")
        inputs = {k: v.to(adapter.device) for k, v in inputs.items()}
        out = adapter.model.generate(**inputs, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     pad_token_id=adapter.tokenizer.pad_token_id,
                                     logits_processor=LogitsProcessorList([first]), **extra)
        t1 = clock.mark()
        n_in = int(inputs["input_ids"].shape[1])
        return _result(clock, t0, first.first, t1, n, n_in, int(out.shape[1]) - n_in)

    return run


def ours(adapter, clock: Clock, n: int, method: str, budget, params: dict):
    """encode -> select -> answer, end to end (method 'none': the unpruned answer)."""
    force = dict(adapter.fixed_length_kwargs(n))

    def run(image, prompt):
        first = FirstLogits(clock)
        t0 = clock.mark()
        enc = mipruner.encode_for(adapter, image, prompt, [] if method == "none" else [method])
        t_enc = clock.mark()
        cache: dict = {}
        sel = None if method == "none" else mipruner.select(adapter, enc, method, budget, cache=cache,
                                                            strict=False, **params)
        t_sel = clock.mark()
        ans = mipruner.answer(adapter, enc, sel, max_new_tokens=n, cache=cache,
                              logits_processor=[first], **force)
        t1 = clock.mark()
        return _result(clock, t0, first.first, t1, n, ans.input_tokens, len(ans.token_ids), encode_ms=(t0, t_enc),
                       select_ms=(t_enc, t_sel))

    return run


def batch(adapter, clock: Clock, n: int, method: str, budget, params: dict, size: int):
    """B items encoded together, selected one by one, answered as one batch."""
    asked = mipruner.signals_for([] if method == "none" else [method])
    force = dict(adapter.fixed_length_kwargs(n))

    def run(image, prompt):
        first = FirstLogits(clock)
        t0 = clock.mark()
        encs = encode_items(adapter, [(image, prompt)] * size, batch=size, signals=asked)
        t_enc = clock.mark()
        sels = [None if method == "none" else mipruner.select(adapter, e, method, budget, cache={}, strict=False,
                                                              **params) for e in encs]
        t_sel = clock.mark()
        got = answer_items(adapter, list(zip(encs, sels)), max_new_tokens=n, max_batch=size,
                           logits_processor=[first], **force)
        t1 = clock.mark()
        return _result(clock, t0, first.first, t1, n, got[0].input_tokens, len(got[0].token_ids),
                       encode_ms=(t0, t_enc), select_ms=(t_enc, t_sel))

    return run


def view(adapter, clock: Clock, n: int, methods: list[str], budget, reference: bool, alone: bool = False):
    """The app's view on one cached encoding per (image, prompt): the unpruned answer alone (`alone`),
    or the rows of one `answer_batch` (the unpruned one when `reference`, and every method's)."""
    force = dict(adapter.fixed_length_kwargs(n))
    encodings: dict = {}

    def run(image, prompt):
        key = (id(image), prompt)
        if key not in encodings:  # the app encodes once per image and prompt; the view is what is timed
            encodings[key] = mipruner.encode_for(adapter, image, prompt, methods)
        enc = encodings[key]
        first = FirstLogits(clock)
        t0 = clock.mark()
        if alone:
            a = adapter.generate(enc, None, max_new_tokens=n, logits_processor=[first], **force)
            t1 = clock.mark()
            return _result(clock, t0, first.first, t1, n, a.input_tokens, len(a.token_ids))
        cache: dict = {}
        sels = [mipruner.select(adapter, enc, m, budget, cache=cache, strict=False) for m in methods]
        t_sel = clock.mark()
        got = answer_batch(adapter, enc, [None, *sels] if reference else sels, max_new_tokens=n, cache=cache,
                           logits_processor=[first], **force)
        t1 = clock.mark()
        out = _result(clock, t0, first.first, t1, n, got[0].input_tokens, len(got[0].token_ids),
                      select_ms=(t0, t_sel))
        out["row_tokens"] = [g.input_tokens for g in got]  # the unpruned row's and the pruned rows' prompts
        return out

    return run


def encode(adapter, clock: Clock, size: int):
    """`encode_items` of B images alone (what MI and Random read: nothing of the tower)."""
    def run(image, prompt):
        t0 = clock.mark()
        encode_items(adapter, [(image, prompt)] * size, batch=size, signals=mipruner.signals_for(["mi"]))
        t1 = clock.mark()
        clock.sync()
        return {"total_ms": clock.ms(t0, t1), "per_image_ms": clock.ms(t0, t1) / size, "ttft_ms": None,
                "decode_ms_per_token": None, "prompt_tokens": None, "new_tokens": None}

    return run
