"""No compilation inside a request: after `mipruner.serve.warm_up` on the compiled path (bucket 64, static cache,
compile; backend: dynamo's CompileCounter, set in `common/decode.COMPILE`, which runs each captured graph
eagerly), 20 requests with varied images, prompts, budgets and methods (each a first view: the unpruned
answer with three methods' answers, then a slider move: the methods alone) capture no new graph; the
shapes they ran are within the warm-up's fixed set, and the static caches held stay bounded."""
from __future__ import annotations

import threading

import pytest
import torch

from mipruner.serve.batch import answer_batch
from mipruner.methods import encode_for, select
from mipruner.models.common import decode as P
from mipruner.models.common import rows as R
from mipruner.testing import embedded_encoding
from mipruner.serve.warm_up import buckets, warm_up

from .models.tiny_llava import scene
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

NEW = 3
METHODS = ("mi", "random", "similarity", "divprune", "vispruner")
PROMPTS = ["What is red in the image?", "Where is the square?", "Is there a cat in this picture? Answer yes or no.",
           "Describe the picture.", "How many objects are there, and what colour are they?"]
BUDGETS = (0.05, 0.1, 0.25, 0.5, 8)


def test_buckets_are_a_fixed_set():
    assert buckets(4, 207, 64) == ([1, 2, 4], [64, 128, 192, 256, 320])
    assert buckets(6, 64, 64) == ([1, 2, 4, 8], [64, 128])
    # every row count up to the view's, its own bucket included (5 rows run as 8; 1 row as 1)
    assert buckets(1, 64, 64)[0] == [1] and buckets(5, 64, 64)[0] == [1, 2, 4, 8]
    for rows in range(1, 34):
        counts = buckets(rows, 64, 64)[0]
        assert counts == [1 << i for i in range(len(counts))] and counts[-1] == R.batch_bucket(rows), rows


def test_after_the_warm_up_no_request_compiles(monkeypatch):
    from torch._dynamo.testing import CompileCounter

    a, e0 = embedded_encoding()
    counter = CompileCounter()
    monkeypatch.setitem(P.COMPILE, "backend", counter)
    torch._dynamo.reset()
    path = dict(bucket=64, static_cache=True, compile=True)
    try:
        n = warm_up(a, threading.Lock(), scene(96, 80, square=(10, 10, 40, 40)), PROMPTS[0], METHODS[:3], 0.1, NEW,
                    **path)
        warmed, shapes = counter.frame_count, {k: set(v) for k, v in a.decode_state.shapes.items()}
        assert n > 3 and warmed > 0
        for i in range(20):
            ms = tuple(METHODS[(i + j) % len(METHODS)] for j in range(3))
            image = scene(64 + 8 * (i % 5), 64 + 6 * (i % 3), square=(i, 2 * i % 30, 30 + i, 40), seed=i)
            enc = encode_for(a, image, PROMPTS[i % len(PROMPTS)], ms)
            sels = [select(a, enc, m, BUDGETS[i % len(BUDGETS)], strict=False) for m in ms]
            answer_batch(a, enc, [None, *sels], max_new_tokens=NEW)
            answer_batch(a, enc, sels, max_new_tokens=NEW)
        assert counter.frame_count == warmed, (counter.frame_count, warmed, a.decode_state.shapes)
        assert {k: set(v) for k, v in a.decode_state.shapes.items()} == shapes  # nothing outside the warmed set
        assert len(a.decode_state.caches) <= P.STATIC_CACHES
        assert all(w % 64 == 0 for _, w in shapes["prefill"]) and all(R.batch_bucket(b) == b for b, _ in shapes["step"])
    finally:
        a.use_decode_path()
        a.decode_state.compiled.clear()
        a.decode_state.caches.clear()
        torch._dynamo.reset()
