"""The selection contract every method passes, as functions an author can run on their own method.

    failures = mipruner.testing.check_pruner("center")   # [] when it passes; else one sentence each
    python -m mipruner.check_pruner center --plugins my_module

What is checked (the built-ins pass the same checks, in tests/pruners/test_contract.py and
tests/test_methods_contract.py):
- the spec: every `Param` default validates and has a one-line doc; the score label (the app's colour
  bar: "quantity (unit)", or None when the scores mean nothing) is one short line;
- pre-LLM methods through `mipruner.prune` on random tensors: budgets as ints (1, 7, N_V) and shares
  (0.25, 1.0); keep (K,) int64 ascending and unique within [0, N_V); order a permutation of keep;
  scores (N_V,) float32; tokens one row per kept index; PMI shapes for MI methods; the keep-all case;
  the same selection twice for a fixed seed; every choice of every choice parameter (a rule may
  keep fewer than the budget, as MI's adaptive K does, never more); float16 and
  bfloat16 inputs (attention and keys too) keeping that contract (`low_precision_failures`), and
  all-zero rows giving finite scores; every tensor on the inputs' device and none
  made without `device=` (run under `torch.set_default_device("meta")`, the result must not change);
- every method through `mipruner.select` on a model's encoding (the embedded `shapes-llava` unless an
  adapter is given): budgets 1, 5, 0.25, keep-all, determinism with and without a cache, the meta
  device, a budget above N_V and an unknown parameter refused;
- the answer where the method prunes (`answer_failures`): an in-LLM method keeping every token
  answers as the unpruned model, and a pruned answer is the same one by one (with and without the
  select cache) and through `answer_batch`; every method's answer counts its visual tokens (merged
  rows and `prefix` included).
Adaptive methods (`adaptive=True`, e.g. `mi_adaptive`) may keep between 1 and the budget: the
checks take the K they chose and skip "keep-all keeps every token". An in-LLM selection whose last
stage withdraws every visual token (`extras["withdrawn_at"]`) keeps none, at any budget: the
keep-all checks skip it too; a pre-LLM method keeping none fails, with the rule in the sentence.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

import numpy as np
import torch

from .methods import select
from .pruners._registry import ContractError, adaptive_k, get_pruner, prune
from .pruners.selection import Selection, selection_failures, withdrawn_at
from .pruners.signals import Signals, encode_kwargs

N_V, D, N_T = 48, 16, 5
HEADS, D_F = 3, 24  # heads of the random per-head attention; width of the random pre-projector features
VIDEO_FRAMES = 8  # frames of the checker's clip (`embedded_encoding(video=True)`): DyCoke groups frames in fours
FRAMES = 4  # frames of the random video (frame_index) given to the video methods and the per-frame option
SCORE_LABEL_CHARS = 60  # a colour bar's caption


@contextlib.contextmanager
def meta_default():
    """Tensors made without `device=` land on the meta device (and break what mixes them with data).

    `with torch.device("meta")` pushes a default-device mode and pops it on exit. Restoring with
    `torch.set_default_device(torch.get_default_device())` instead would leave a "cpu" default-device
    mode installed in the calling thread for good, which routes every later torch call through
    Python (`__torch_function__`): about 2.7x the per-op overhead on the CPU here, e.g. after a
    plug-in's quick check in a bench or eval process."""
    with torch.device("meta"):
        yield


def tensor_inputs(spec, n: int = N_V, seed: int = 0, dtype=torch.float32, device="cpu") -> dict:
    """Random inputs for a pre-LLM method: visual (n, D), text (N_T, D), and the vision encoder's
    attention / keys ([CLS] first) when it reads them, per-head attention (HEADS, n+1, n+1) and
    pre-projector features (n, D_F) when it takes them, and `frame_index` (n,) (FRAMES frames of n / FRAMES
    tokens) when it accepts it (the video methods; every other pre-LLM method's per-frame option)."""
    g = torch.Generator().manual_seed(seed)
    kw = dict(visual=torch.randn(n, D, generator=g), text=torch.randn(N_T, D, generator=g))
    if spec.needs_attention or {"attention", "keys"} & set(spec.needs):
        kw.update(attention=torch.softmax(torch.randn(n + 1, n + 1, generator=g) * 3, dim=-1),
                  keys=torch.randn(n + 1, 12, generator=g))
    if "attention_heads" in spec.inputs:
        kw["attention_heads"] = torch.softmax(torch.randn(HEADS, n + 1, n + 1, generator=g) * 3, dim=-1)
    if "features" in spec.inputs and spec.signals.features:
        kw["features"] = torch.randn(n, D_F, generator=g)
    kw = {k: v.to(device=device, dtype=dtype) for k, v in kw.items()}  # a bf16 model's outputs are all bf16
    if "frame_index" in spec.accepts:  # a video of FRAMES frames (EVS; every method's per-frame option)
        kw["frame_index"] = (torch.arange(n, device=device) * FRAMES) // n
    return kw


def _fixed_seed(spec) -> dict:
    return {"seed": 0} if "seed" in spec.param_names else {}


def _try(what: str, out: list[str], fn: Callable):
    """fn(), or None after noting what it raised (a ContractError: the broken part only)."""
    try:
        return fn()
    except ContractError as e:
        out.append(f"{what}, {e.failure}")
    except Exception as e:  # the method's own error: reported, the other checks still run
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        out.append(f"{what}, it raised {type(e).__name__}" + (f": {text}" if text else ""))
    return None


def _same(a, b) -> bool:
    return torch.equal(a.keep.cpu(), b.keep.cpu()) and torch.equal(a.order.cpu(), b.order.cpu())


def spec_failures(name: str) -> list[str]:
    """The registration's own contract: parameters and score label."""
    spec, out = get_pruner(name), []
    for p in spec.params:
        if not p.doc.strip():
            out.append(f"parameter {p.name!r} has no doc (the app shows it under its control)")
    label = spec.score_label
    if label is not None and (not isinstance(label, str) or not label.strip() or "\n" in label
                              or len(label) > SCORE_LABEL_CHARS):
        out.append(f"score_label must be None or one line of at most {SCORE_LABEL_CHARS} characters "
                   f"(\"quantity (unit)\" for the app's colour bar), got {label!r}")
    return out


def quick_failures(name: str, device="cpu") -> list[str]:
    """The core of the tensor contract, cheap enough to run when a plug-in loads: int and share
    budgets, keep-all, determinism for a fixed seed, no tensor off the inputs' device."""
    spec, out = get_pruner(name), []
    kw = {**tensor_inputs(spec, device=device), **_fixed_seed(spec)}
    dev = kw["visual"].device
    for budget in (1, 7, 0.25, 1.0):
        k = max(1, math.floor(budget * N_V + 0.5)) if isinstance(budget, float) else budget
        sel = _try(f"with budget {budget}", out, lambda b=budget: prune(name, budget=b, **kw))
        if sel is None:
            continue
        out += [f"with budget {budget}, {f}" for f in selection_failures(sel, n=N_V, k=k, device=dev, adaptive=spec.adaptive, stage=spec.stage)]
        if isinstance(budget, float) and budget == 1.0 and not out and not spec.adaptive \
                and sel.keep.cpu().tolist() != list(range(N_V)):
            out.append("with budget 1.0 (keep all), it does not keep every token")
    if out:
        return out
    a = _try("run twice with budget 7", out, lambda: prune(name, budget=7, **kw))
    b = _try("run twice with budget 7", out, lambda: prune(name, budget=7, **kw))
    if a is not None and b is not None and not _same(a, b):
        out.append("two runs with the same inputs and seed select different tokens, it must be deterministic")
    with meta_default():
        m = _try("under torch.set_default_device('meta')", out, lambda: prune(name, budget=7, **kw))
    if a is not None and m is not None and _same(a, b) and (selection_failures(m, n=N_V, k=7, device=dev, adaptive=spec.adaptive, stage=spec.stage)
                                                            or not _same(m, a)):
        out.append("it creates a tensor without device=, so under torch.set_default_device('meta') its selection "
                   "changes or leaves the inputs' device")
    return out


def tensor_failures(name: str, device="cpu") -> list[str]:
    """The whole tensor contract of a pre-LLM method through `mipruner.prune` (see the module docstring)."""
    spec = get_pruner(name)
    out = quick_failures(name, device)
    kw = {**tensor_inputs(spec, device=device), **_fixed_seed(spec)}
    dev = kw["visual"].device
    sel = _try(f"with budget {N_V}", out, lambda: prune(name, budget=N_V, **kw))
    if sel is not None and not spec.adaptive and sel.keep.cpu().tolist() != list(range(N_V)):
        out.append(f"with budget {N_V} (keep all, in tokens), it does not keep every token")
    sel = _try("with budget 7", out, lambda: prune(name, budget=7, **kw))
    if sel is not None:
        if sel.method != name:
            out.append(f"the selection's method is {sel.method!r}, not {name!r}")
        if spec.is_mi and (sel.pmi is None or tuple(sel.pmi.shape) != (N_V, N_T) or sel.pivot is None
                           or tuple(sel.pivot.shape) != (N_V,) or not bool(torch.isfinite(sel.pmi).all())):
            out.append(f"an MI method returns pmi ({N_V}, {N_T}) finite and pivot ({N_V},)")
        rows = int(sel.keep.numel())  # one merged row per kept index; `prefix` rows are counted in K, not here
        if sel.tokens is not None and tuple(sel.tokens.shape) != (rows, D):
            out.append(f"tokens must be (kept, d) = ({rows}, {D}), got {tuple(sel.tokens.shape)}")
    for p in spec.options:
        for c in (p.choices if p.kind == "choice" else ()):
            s = _try(f"with {p.name}={c!r}", out, lambda c=c, p=p: prune(name, budget=7, **{**kw, p.name: c}))
            if s is not None:  # a rule may keep fewer (MI's adaptive K), never more
                k = s.budget if isinstance(s, Selection) and 1 <= s.budget <= 7 else 7
                out += [f"with {p.name}={c!r}, {f}" for f in selection_failures(s, n=N_V, k=k, device=dev)]
    for dtype in (torch.float16, torch.bfloat16):
        out += low_precision_failures(name, dtype, device, budgets=(9,))
    zero = {**kw, "visual": kw["visual"].clone()}
    zero["visual"][:5] = 0.0
    s = _try("with all-zero visual rows", out, lambda: prune(name, budget=9, **zero))
    if s is not None and not bool(torch.isfinite(s.scores).all()):
        out.append("all-zero visual rows give non-finite scores")
    return out


def low_precision_failures(name: str, dtype: torch.dtype, device="cpu", n: int = N_V,
                           budgets: tuple = (1, 7, N_V)) -> list[str]:
    """The selection contract of a pre-LLM method on inputs of `dtype` (every input, attention and
    keys included, as a bf16 / fp16 model gives them): keep ascending, unique, in range, of the
    budget's size; scores (N_V,) float32 and finite (pmi too); the same selection twice; every
    choice of every choice parameter at the first budget but one."""
    spec, out = get_pruner(name), []
    kw = {**tensor_inputs(spec, n=n, dtype=dtype, device=device), **_fixed_seed(spec)}
    dev, what = kw["visual"].device, f"with {str(dtype).replace('torch.', '')} inputs"
    runs = [(b, {}) for b in budgets]
    runs += [(budgets[min(1, len(budgets) - 1)], {p.name: c}) for p in spec.options if p.kind == "choice"
             for c in p.choices if c != p.default]
    for budget, extra in runs:
        at = f"{what} and budget {budget}" + "".join(f", {k}={v!r}" for k, v in extra.items())
        a = _try(at, out, lambda b=budget, e=extra: prune(name, budget=b, **{**kw, **e}))
        if a is None:
            continue
        k = a.budget if (extra or spec.adaptive) and isinstance(a, Selection) and 1 <= a.budget <= budget \
            else budget  # adaptive K
        bad = selection_failures(a, n=n, k=k, device=dev)
        if not bad and not bool(torch.isfinite(a.scores).all()):
            bad.append("its scores are not all finite")
        if not bad and a.pmi is not None and not bool(torch.isfinite(a.pmi).all()):
            bad.append("its pmi is not all finite")
        b = _try(at + ", run twice", out, lambda b=budget, e=extra: prune(name, budget=b, **{**kw, **e}))
        if not bad and b is not None and not _same(a, b):
            bad.append("two runs with the same inputs and seed select different tokens")
        out += [f"{at}, {f}" for f in bad]
    return out


def select_failures(name: str, adapter, encoded) -> list[str]:
    """The contract through `mipruner.select` on one encoding (any stage; in-LLM methods included)."""
    spec, out, n = get_pruner(name), [], encoded.n_visual
    dev = encoded.visual.device
    for budget in (1, 5, 0.25):
        k = max(1, math.floor(budget * n + 0.5)) if isinstance(budget, float) else budget
        sel = _try(f"select with budget {budget}", out, lambda b=budget: select(adapter, encoded, name, b, cache={}))
        if sel is not None:
            kk = adaptive_k(spec, sel, k)
            out += [f"select with budget {budget}, {f}"
                    for f in selection_failures(sel, n=n, k=k, adaptive=spec.adaptive, stage=spec.stage)]
            if sel.budget != kk and withdrawn_at(sel) is None:
                out.append(f"select with budget {budget}, {sel.budget} tokens reach the LLM, not {k}"
                           + (" (an adaptive method keeps between 1 and the budget)" if spec.adaptive else ""))
    sel = _try(f"select with budget {n} (keep all)", out, lambda: select(adapter, encoded, name, n))
    if sel is not None and not spec.adaptive and withdrawn_at(sel) is None and sel.keep.cpu().tolist() != list(range(n)):
        out.append(f"select with budget {n} (keep all) does not keep every token")
    a = _try("select, run twice", out, lambda: select(adapter, encoded, name, 6))
    b = _try("select, run twice", out, lambda: select(adapter, encoded, name, 6, cache={}))
    if a is not None and b is not None and not _same(a, b):
        out.append("select: two runs (without and with a cache) select different tokens")
    with meta_default():
        m = _try("select under torch.set_default_device('meta')", out, lambda: select(adapter, encoded, name, 6))
    if a is not None and m is not None and b is not None and _same(a, b) and (m.keep.device.type == "meta" or not _same(m, a)):
        out.append("select: it creates a tensor without device= (its selection changes under the meta default)")
    if a is not None and get_pruner(name).stage != "llm" and a.keep.device != dev:
        out.append(f"select: keep is on {a.keep.device}, the encoding on {dev}")
    for what, kw, err in ((f"a budget of N_V + 1 = {n + 1}", {"budget": n + 1}, ValueError),
                          ("an unknown parameter", {"budget": 3, "bogus_parameter": 1}, TypeError)):
        try:
            select(adapter, encoded, name, **kw)
            out.append(f"select: {what} must raise {err.__name__}")
        except err:
            pass
        except Exception as e:
            out.append(f"select: {what} raised {type(e).__name__}, not {err.__name__}")
    return out


def answer_failures(name: str, adapter, encoded, max_new_tokens: int = 4) -> list[str]:
    """Where a method actually prunes, its answer: for an in-LLM method, keeping every token answers
    as the unpruned model (not for an adaptive one: the budget is only its cap) and a pruned
    selection answers the same one by one with and without the select cache and through
    `answer_batch`; for any method, a pruned selection (merged rows, `prefix` included) answers
    with as many visual tokens as reach the LLM."""
    from .serve.batch import answer_batch
    from .methods import answer

    spec, out, n = get_pruner(name), [], encoded.n_visual
    ref = _try("the unpruned answer", out, lambda: answer(adapter, encoded, None, max_new_tokens=max_new_tokens))
    if ref is None:
        return out
    if spec.stage == "llm" and not spec.adaptive:
        c: dict = {}
        sel = _try("select keeping every token", out, lambda: select(adapter, encoded, name, n, cache=c))
        got = None if sel is None or withdrawn_at(sel) is not None else _try("answer keeping every token", out, lambda: answer(
            adapter, encoded, sel, max_new_tokens=max_new_tokens, cache=c))
        if got is not None and got.token_ids != ref.token_ids:
            out.append("answer: keeping every token does not give the unpruned answer "
                       f"({got.token_ids} vs {ref.token_ids})")
    c = {}
    k = max(1, n // 4)
    sel = _try(f"select with budget {k}", out, lambda: select(adapter, encoded, name, k, cache=c))
    if sel is None:
        return out
    one = _try("answer", out, lambda: answer(adapter, encoded, sel, max_new_tokens=max_new_tokens, cache=c))
    if one is None:
        return out
    if spec.stage == "llm":
        again = _try("answer without the select cache", out,
                     lambda: answer(adapter, encoded, sel, max_new_tokens=max_new_tokens))
        batched = _try("answer_batch", out, lambda: answer_batch(adapter, encoded, [None, sel],
                                                               max_new_tokens=max_new_tokens, cache=c)[1])
        for what, other in (("without the select cache", again), ("through answer_batch", batched)):
            if other is not None and other.token_ids != one.token_ids:
                out.append(f"answer: {what} it answers {other.token_ids}, one by one {one.token_ids}")
        if one.visual_tokens < sel.budget:
            out.append(f"answer: {one.visual_tokens} visual tokens reach the LLM, fewer than the selection's {sel.budget}")
    elif one.visual_tokens != sel.budget:
        out.append(f"answer: {one.visual_tokens} visual tokens reach the LLM, not the selection's {sel.budget}")
    return out


def embedded_encoding(model: str = "shapes-llava", device=None, signals=None, video: bool = False):
    """(adapter, encoding) of a red square on noise with attention (and `signals`: what a method asks for
    more, `MethodSpec.signals`), on the embedded model; `video`: a VIDEO_FRAMES-frame clip of the square
    moving (what a video method, `MethodSpec.video`, is checked on: long enough for DyCoke's groups of four)."""
    from PIL import Image

    from .media import Video
    from .models import load

    adapter = load(model, device=device or "cpu")
    rng = np.random.default_rng(0)

    def picture(shift: int) -> Image.Image:
        arr = np.zeros((112, 112, 3), dtype=np.uint8)
        arr[..., 2] = 200
        arr[..., :2] = rng.integers(0, 40, size=(112, 112, 2), dtype=np.uint8)
        arr[20:60, 30 + shift:70 + shift] = (255, 0, 0)
        return Image.fromarray(arr)

    media = Video(frames=[picture(4 * i) for i in range(VIDEO_FRAMES)], indices=list(range(VIDEO_FRAMES)), fps=4.0,
                  total_frames=VIDEO_FRAMES) if video else picture(0)
    kw = encode_kwargs(Signals.of(True, signals))
    return adapter, adapter.encode(media, "What colour is the square?", **kw)


def check_pruner(name: str, *, adapter=None, encoded=None, model: str | None = "shapes-llava",
                 device=None) -> list[str]:
    """Every contract check on method `name`: [] when it passes, else one sentence per failure.
    adapter/encoded: the encoding `select` is checked on (default: the embedded model's, loaded
    here; model=None skips the select checks for a pre-LLM method)."""
    try:
        spec = get_pruner(name)
    except ValueError as e:
        return [str(e)]
    out = spec_failures(name)
    if spec.stage != "llm":
        out += tensor_failures(name, device or "cpu")
    if encoded is None and (model is not None or spec.stage == "llm"):
        try:
            adapter, encoded = embedded_encoding(model or "shapes-llava", device, spec.signals, video=spec.video)
        except ValueError as e:  # e.g. it asks for an encoder block the model does not have
            return out + [f"the encoding it asks for (encoder_layer={spec.encoder_layer}) failed: {e}"]
    if encoded is not None:
        out += select_failures(name, adapter, encoded)
        if adapter is not None:
            out += answer_failures(name, adapter, encoded)
    return out


__all__ = ["answer_failures", "check_pruner", "embedded_encoding", "low_precision_failures", "meta_default", "quick_failures",
           "select_failures", "spec_failures", "tensor_failures", "tensor_inputs"]
