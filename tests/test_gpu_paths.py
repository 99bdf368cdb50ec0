"""What a CUDA run would break or slow, shown on the CPU (the findings of docs/gpu-review.md).

  compiled step   under a static cache the decoding step gets inputs of ONE shape at every step and
                  for every budget of one encoding in one bucket (LLaVA through `generate`, Qwen
                  through our loop, whose mask used to grow a column a step), and `torch.compile`
                  (dynamo with a counting backend) builds one graph for all of them;
  attention maps  the vision-tower capture of a bf16 tower makes no float32 copy of every head's map;
  SDPA's math     the kernel CUDA falls back to (`SDPBackend.MATH`), in bf16: left-padded batches
                  (pad queries attend to nothing) stay finite and keep the keep-all answer; the
                  in-LLM layer loop keeps the keep-all anchor;
  ZeroGPU         app.py imports `spaces` before torch, and every handler that runs the model's
                  tensors is wrapped in `spaces.GPU` (a stand-in `spaces` package records it); the
                  state those handlers receive pickles (tests/app/test_zerogpu.py runs every
                  handler through a forked, pickling worker).
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import mipruner
from mipruner import inllm
from mipruner.serve.batch import answer_batch, use_decode_path

from .conftest import TEST_DEVICE
from .models import tester_models
from .models.tiny_llava import scene
from .no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "What colour is the square?"
NEW = 5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gpu_paths"))
    return {fam: tester_models.build(fam, root) for fam in ("llava", "qwen2_vl", "qwen3_vl")}


def _load(paths, fam, dtype=None):
    ad = mipruner.load(paths[fam], device=TEST_DEVICE, dtype=dtype)
    return ad, ad.encode(scene(160, 120), PROMPT, need_attention=True)


# ------------------------------------------------------------------------------ compiled step
@pytest.mark.parametrize("fam", ["llava", "qwen3_vl"])
def test_the_static_cache_step_sees_one_shape(paths, fam):
    ad, enc = _load(paths, fam)
    use_decode_path(ad, bucket=16, static_cache=True)
    seen: list = []

    def record(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        x = ids if ids is not None else kwargs["inputs_embeds"]
        if x.shape[1] == 1:  # a decoding step (the prefill has the prompt's width)
            m, p = kwargs.get("attention_mask"), kwargs.get("position_ids")
            seen.append((tuple(x.shape), None if m is None else tuple(m.shape), None if p is None else tuple(p.shape)))

    handle = ad.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        for k in (5, 9):  # two budgets whose padded prompts fall in one bucket
            answer_batch(ad, enc, [None, torch.arange(k)], max_new_tokens=NEW, **ad.fixed_length_kwargs(NEW))
    finally:
        handle.remove()
        ad.use_decode_path()
    assert len(seen) == 2 * (NEW - 1)
    assert len(set(seen)) == 1, seen


def test_the_compiled_qwen_step_compiles_once(paths, monkeypatch):
    """With a growing mask, a step compiled with dynamic=False recompiled at every step (5 graphs for
    5 steps before the fix); now one graph serves every step and both budgets. (The prefill is
    compiled too: one graph per (rows, width) bucket of its groups, counted apart.)"""
    from torch._dynamo.testing import CompileCounter

    from mipruner.models.common import decode as P
    from mipruner.models.common import rows as R

    ad, enc = _load(paths, "qwen2_vl")
    counter = CompileCounter()
    monkeypatch.setitem(P.COMPILE, "backend", counter)  # what `DecodeEngine.compiled` passes to torch.compile
    torch._dynamo.reset()
    use_decode_path(ad, bucket=16, static_cache=True, compile=True)
    full = enc.prompt_tokens
    buckets = set()
    for lengths in ([full, full - enc.n_visual + k] for k in (5, 9)):
        buckets |= {(R.batch_bucket(len(g)), R.round_up(max(lengths[i] for i in g), 16)) for g in R.groups(lengths, 16)}
    try:
        plain = [a.token_ids for a in answer_batch(ad, enc, [None, torch.arange(5)], max_new_tokens=NEW,
                                                   **ad.fixed_length_kwargs(NEW))]
        for k in (5, 9):
            got = answer_batch(ad, enc, [None, torch.arange(k)], max_new_tokens=NEW, **ad.fixed_length_kwargs(NEW))
            assert all(len(a.token_ids) == NEW for a in got)
        assert counter.frame_count == 1 + len(buckets), (counter.frame_count, buckets)  # ONE step graph
        ad.use_decode_path()
        assert [a.token_ids for a in answer_batch(ad, enc, [None, torch.arange(5)], max_new_tokens=NEW,
                                                  **ad.fixed_length_kwargs(NEW))] == plain
    finally:
        ad.use_decode_path()
        torch._dynamo.reset()


# ------------------------------------------------------------------------------ attention maps
class FloatCopies(TorchDispatchMode):
    """Records the shapes of float32 tensors that ops make from lower-precision inputs."""

    def __init__(self):
        super().__init__()
        self.shapes: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        low = any(isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) for a in args)
        if low and isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            self.shapes.append(tuple(out.shape))
        return out


def test_the_tower_attention_capture_copies_no_per_head_map(paths):
    from mipruner.models.common import clip_attention as A

    ad, _ = _load(paths, "llava", torch.bfloat16)
    tower = ad.model.model.vision_tower
    cfg = ad.config.vision_config
    pixels = torch.randn(2, 3, cfg.image_size, cfg.image_size, device=TEST_DEVICE, dtype=torch.bfloat16)
    n = (cfg.image_size // cfg.patch_size) ** 2 + 1
    heads = (2, cfg.num_attention_heads, n, n)
    base, copies = FloatCopies(), FloatCopies()
    with base:  # the tower's own float32 work (eager attention takes its softmax in float32)
        tower(pixels, output_attentions=True)
    with A.capture_attention(tower, 0) as cap, copies:
        out = tower(pixels, output_attentions=True)
    extra = collections.Counter(copies.shapes) - collections.Counter(base.shapes)
    assert heads not in extra, extra  # the capture reduces the per-head maps, it never copies them to float32
    assert cap["attention"].dtype == torch.float32 and cap["attention"].shape == (2, n, n)
    assert torch.equal(cap["attention"], out.attentions[0].float().mean(dim=1))


# ------------------------------------------------------------------------------ SDPA's math kernel
@pytest.mark.parametrize("fam", ["llava", "qwen2_vl"])
def test_left_padded_batches_under_the_math_kernel_in_bf16(paths, fam):
    ad, enc = _load(paths, fam, torch.bfloat16)
    rows = [None, torch.arange(3), torch.arange(enc.n_visual - 5, enc.n_visual)]  # pads of 2 lengths
    if fam == "llava":
        from mipruner.models.common.embeds_rows import batch_inputs

        b = batch_inputs(ad, [(enc, r) for r in rows], None, 16)
        inputs = dict(inputs_embeds=b["inputs_embeds"], attention_mask=b["attention_mask"],
                      position_ids=b["position_ids"])
    else:
        from mipruner.models.qwen.batch import pad_id, padded_inputs

        b = padded_inputs([ad.row_inputs(enc, r) for r in rows], 16 * -(-enc.prompt_tokens // 16), pad_id(ad))
        inputs = {k: b[k] for k in ("input_ids", "attention_mask", "position_ids", "mm_encoder_outputs")}
    assert int((b["attention_mask"] == 0).sum()) > 0  # some queries attend to nothing but pads
    first = ad.generate(enc, max_new_tokens=1).token_ids
    with sdpa_kernel(SDPBackend.MATH):
        out = ad.model(**inputs, output_hidden_states=True)
        got = answer_batch(ad, enc, rows, max_new_tokens=3)
    assert all(bool(torch.isfinite(h).all()) for h in out.hidden_states)  # pad rows included
    assert bool(torch.isfinite(out.logits).all())
    assert got[0].token_ids[:1] == first and all(len(a.token_ids) >= 1 for a in got)


@pytest.mark.parametrize("fam", ["llava", "qwen3_vl"])
def test_the_in_llm_loop_under_the_math_kernel_in_bf16(paths, fam):
    """Batch 1, no padding: every layer call gets no mask (SDPA's causal flag), so no additive bf16
    mask and no -inf row can arise; the keep-all anchor holds under the math kernel."""
    ad, enc = _load(paths, fam, torch.bfloat16)
    masks: list = []
    hooks = [layer.register_forward_pre_hook(lambda _m, _a, kw: masks.append(kw.get("attention_mask")),
                                             with_kwargs=True) for layer in ad.text_decoder().layers]
    try:
        with sdpa_kernel(SDPBackend.MATH):
            ref = ad.prefill_logits(enc)
            for layer in (1, 2):
                assert torch.equal(inllm.prefill_logits(ad, enc, None, layer=layer), ref)
            answers = []
            for name in ("fastv", "sparsevlm"):
                cache: dict = {}
                sel = mipruner.select(ad, enc, name, 0.25, cache=cache)
                answers.append(mipruner.answer(ad, enc, sel, max_new_tokens=3, cache=cache))
    finally:
        for h in hooks:
            h.remove()
    assert bool(torch.isfinite(ref).all()) and all(1 <= len(a.token_ids) <= 3 for a in answers)
    assert masks and all(m is None for m in masks)


# ------------------------------------------------------------------------------ ZeroGPU
FAKE_SPACES = '''import sys
TORCH_FIRST = "torch" in sys.modules
WRAPPED = []


def GPU(duration=60):
    def wrap(fn):
        WRAPPED.append((fn.__name__, duration))
        return fn
    return wrap
'''


@pytest.fixture
def fake_spaces(tmp_path):
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "__init__.py").write_text(FAKE_SPACES)
    return tmp_path


def test_app_imports_spaces_before_torch(fake_spaces):
    """Importing app.py imports `spaces` (before, only building the handlers did: after the model load)."""
    code = "import sys, app; print('spaces' in sys.modules); import spaces; print(spaces.TORCH_FIRST)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_spaces), ROOT]))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_every_handler_that_runs_the_model_is_wrapped(fake_spaces, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_spaces))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    from components.core.logic import AppLogic
    from components.core.settings import Settings
    from components.hosting.spaces_gpu import DURATIONS, generate_seconds, gpu

    import spaces

    logic = AppLogic(None, gpu=gpu, max_new_tokens=32)
    wrapped = dict(spaces.WRAPPED)
    assert sorted(wrapped) == ["encode", "generate", "inspect", "view"]
    assert {k: wrapped[k] for k in DURATIONS} == DURATIONS == {"encode": 30, "view": 15, "inspect": 15}
    # generate's duration is spaces' dynamic kind: a function of generate's own arguments
    s6 = Settings(methods=("mi", "random", "similarity", "attention", "divprune", "fastv"))
    assert wrapped["generate"](None, s6, 32) == generate_seconds(7, 32) == 10 + 12
    assert wrapped["generate"](None, s6) == generate_seconds(7, logic.max_new_tokens)
    assert wrapped["generate"](None, Settings(methods=("mi",)), 512) == 10 + 52 == generate_seconds(2, 512)
    assert generate_seconds(7, 512) == 120  # the cap


def test_the_state_a_zerogpu_handler_receives_pickles():
    import pickle

    from components.core.logic import UIState
    from mipruner.serve.session import Session

    back = pickle.loads(pickle.dumps(UIState(session=Session())))
    assert isinstance(back.session, Session) and back.session.budget is None
