"""No compilation inside a request, for every family and every shape a request can take: after
`mipruner.serve.warm_up` on the compiled path (bucket 64, static cache, compile; backend: dynamo's CompileCounter,
set in `common/decode.COMPILE`, which runs each captured graph eagerly), answers of 1, 32 and 512 new tokens,
batches of 1 to 32 rows and a prompt longer than any warmed width capture no new graph: a shape outside the
declared buckets runs eagerly (`DecodeState.eager` counts it), and its answer is the plain path's."""
from __future__ import annotations

import threading

import pytest

import mipruner
from mipruner.serve.batch import answer_batch
from mipruner.serve.warm_up import warm_up

from .models.batch_check import compare_all, one_by_one
from .models.tiny import TINY, save_tiny
from .models.tiny_llava import scene
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

PROMPT = "What is red in the image?"
FILLER = " Please look at every part of the picture before you answer."
NEW = (1, 32, 512)
ROWS = (1, 3, 5, 9, 17, 32)


@pytest.mark.parametrize("family", sorted(TINY))
def test_after_the_warm_up_no_request_compiles(family, compile_counter, tmp_path):
    a = mipruner.load(save_tiny(family, str(tmp_path / family)))
    text = a.config.get_text_config()
    text.max_position_embeddings = max(int(text.max_position_embeddings), 2048)  # room for 512 new tokens
    if "max_positions" in vars(a):  # the LLaVA family's adapters read it when loaded
        a.max_positions = text.max_position_embeddings
    image = scene(64, 48, square=(8, 8, 30, 30))
    n = warm_up(a, threading.Lock(), image, PROMPT, ("random",), 0.5, 3, bucket=64, static_cache=True, compile=True)
    state = a.decode_state
    warmed, shapes = compile_counter.frame_count, {k: set(v) for k, v in state.shapes.items()}
    assert n >= 3 and warmed > 0 and a.decode_path.compile and state.buckets is not None
    assert {k: set(v) for k, v in state.buckets.shapes.items() if v} == {k: v for k, v in shapes.items() if v}
    try:
        enc = mipruner.encode_for(a, image, PROMPT, ("random",))
        widest = max(w for _, w in shapes["prefill"])
        long, m = enc, 0
        while long.prompt_tokens <= widest:  # a prompt longer than any warmed width
            m += 1
            long = mipruner.encode_for(a, image, PROMPT + FILLER * m, ("random",))
        sel = mipruner.select(a, enc, "random", 0.5)
        for new in NEW:  # every answer length, the longest prompt among them
            got = answer_batch(a, long, [None, sel], max_new_tokens=new, eos_token_id=())
            assert [len(g.token_ids) for g in got] == [new, new]
        for rows in ROWS:  # every row count up to the app's batch
            got = answer_batch(a, enc, [None] + [sel] * (rows - 1), max_new_tokens=32, eos_token_id=())
            assert len(got) == rows and all(len(g.token_ids) == 32 for g in got)
        assert compile_counter.frame_count == warmed, (compile_counter.frame_count, warmed, dict(state.eager))
        assert {k: set(v) for k, v in state.shapes.items()} == shapes  # nothing compiled outside the warmed set
        assert state.eager["prefill"] > 0 and state.eager["step"] > 0  # the unwarmed shapes ran eagerly
        eager = answer_batch(a, long, [None, sel], max_new_tokens=8, eos_token_id=())
        assert compile_counter.frame_count == warmed
        a.use_decode_path()
        ref = one_by_one(a, long, [None, sel], 8, eos_token_id=())  # the plain path
        done, total = compare_all(eager, ref)  # the eager fallback answers as the plain path (tie rule)
        assert done >= total // 2, (done, total)
    finally:
        a.use_decode_path()
        state.compiled.clear()
        state.caches.clear()
