"""The method registry: one registry object, filled by a decorator (timm's `_registry.py` pattern),
for every selection method wherever it selects.

A method is one decorated function in one file, registered as a `MethodSpec` in `METHODS` (a
`mipruner.registry.Registry`: plug-ins, `mipruner.plugins`, go through its public operations too).
Its `MethodSpec` (public name `PrunerSpec`, as `mipruner.PrunerSpec`) says
- `stage`: where it selects. "projector": from the projected visual tokens (and the prompt);
  "vision": also from the vision encoder's attention/keys; "llm": inside the language model
  (FastV, DART, SparseVLM), from the adapter and the encoding;
- `needs`: the inputs it reads ("text", "attention", "keys", "attention_heads", "features", "cls", "adapter");
- `encoder_layer`: which vision-encoder block its `attention` / `keys` / `attention_heads` come from
  (None: the adapter's default block; an int counts blocks as Python does, -1 the last); with
  `needs` and its keywords it makes the `Signals` the encoding must record (`signals.py`);
- `params`: its parameters, each a `Param` with default, range or choices and a one-line doc. The
  app's controls, the settings string, the eval and lmms-eval model arguments are generated from
  them, so a new method with a parameter is one file plus its tests.
- `score_label`: what its `Selection.scores` are, "quantity (unit)", for a heatmap's colour bar;
  None when they carry no meaning (Random's are random draws), so nothing should colour by them.
- `inputs`: the encoding-derived keywords its function takes (attention, keys, ..., cache), read from
  its signature once, here at registration, so no call inspects a signature again.
- `video`: it selects along time (EVS; reads `frame_index`, needs 2+ frames), so it has no per-frame option;
  every other pre-LLM method can be run per frame: `options` (what a call may pass) adds the runner's `per_frame`
  Param (`per_frame.py`) to its own `params`, and `run_pre_llm` applies the split. The registry stores what the
  author declared and wraps nothing; the option follows from the stage and `video`, where the method is run;
- `capture`: whether (and under which conditions) its selection is one capturable computation, a
  `capture.Capturable` it declares itself (None: it always runs eagerly); on CUDA `prune` then replays it
  as a CUDA graph, and `batched.prune_batch` runs B equal-shape inputs as one call when it allows that.
Per-method metadata is a field of `MethodSpec` (with a default) and a keyword of `register_pruner`;
the registry object stores whatever entry it is given.

`prune(name, visual=..., text=..., budget=...)` is the front door for pre-LLM methods on plain
tensors: it resolves the name (with a "did you mean" on typos), validates parameters against their
`Param`s, resolves the budget and checks the tensors. Methods of stage "llm" need a model: call
`mipruner.select(adapter, encoded, name, budget)` (`mipruner/methods.py`), which serves every stage.
`prune` and `select` are the edges: the method functions below them get an int budget in [1, N_V]
and validated parameters, and trust them.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..registry import DuplicateNameError, did_you_mean
from ._table import METHODS
from . import capture as capture_rules  # the inputs' values checked once; on CUDA a selection is a graph replay
from .selection import Selection, check_matrix, resolve_budget, selection_failures
from .param import Param
from .per_frame import PER_FRAME, run as run_frames
from .signals import SIGNAL_INPUTS, Signals, check_layer

# name -> MethodSpec (`_table.py`). `mipruner.plugins` adds its lazy discovery of installed plug-ins as a
# first-use hook, so they register after the built-ins and only when needed.

STAGES = ("projector", "vision", "llm")
NEEDS = ("text", "attention", "keys", "attention_heads", "features", "cls", "adapter")
# Keyword arguments that are inputs drawn from the encoding, not user parameters.
INPUTS = ("attention", "keys", "attention_heads", "features", "cls", "grid", "frame_index", "cache")


@dataclass(frozen=True)
class MethodSpec:
    """A registered selection method (see the module docstring)."""

    name: str
    fn: Callable[..., Selection]
    stage: str
    needs: frozenset
    params: tuple[Param, ...]
    label: str
    summary: str
    is_mi: bool = False  # returns PMI matrices and pivot words
    answer: Callable | None = field(default=None, compare=False)  # stage "llm": answers on its selection
    score_label: str | None = "score"  # Selection.scores as "quantity (unit)"; None: meaningless
    origin: str = ""  # the plug-in that registered it (`mipruner.plugins`); "" for the built-ins
    adaptive: bool = False  # chooses K per input, the budget as its cap: it may keep fewer (at least 1)
    inputs: tuple[str, ...] = ()  # the INPUTS its function takes, from its signature at registration
    encoder_layer: int | None = None  # the vision-encoder block of its attention/keys; None: the default block
    capture: capture_rules.Capturable | None = None  # its own capture conditions (`capture.py`); None: always eager
    video: bool = False  # selects along time (reads frame_index, needs 2+ frames); no per-frame option
    builtin: bool = False  # registered by mipruner's own modules (its selections are trusted, not checked)

    @property
    def accepts(self) -> tuple[str, ...]:
        """The encoding inputs it accepts: those its function takes, and `frame_index` for the per-frame option."""
        extra = "per_frame" in self.param_names and "frame_index" not in self.inputs
        return (*self.inputs, *(("frame_index",) if extra else ()))

    @property
    def checked(self) -> bool:
        """Whether its selections are checked against the contract before anything reads them: every
        method but mipruner's own, whether a plug-in loaded it or a script registered it inline."""
        return bool(self.origin) or not self.builtin

    @property
    def source(self) -> str:
        """Who registered it, for sentences: "plug-in <origin>", or the module of an inline registration."""
        return f"plug-in {self.origin}" if self.origin else f"module {self.fn.__module__}"

    @property
    def needs_text(self) -> bool:
        return "text" in self.needs

    @property
    def needs_attention(self) -> bool:
        return "attention" in self.needs

    @property
    def signals(self) -> Signals:
        """The encoder signals it asks for: those it names in `needs` or takes as keywords, of its block."""
        asked = (set(self.needs) | set(self.inputs)) & set(SIGNAL_INPUTS)
        att = {"attention", "keys", "attention_heads"} & asked
        return Signals(layers=frozenset({self.encoder_layer}) if att else frozenset(),
                       heads=frozenset({self.encoder_layer}) if "attention_heads" in asked else frozenset(),
                       features="features" in asked)

    @property
    def options(self) -> tuple[Param, ...]:
        """What a call of it may pass: its own `params`, then the runner's per-frame split (`per_frame.PER_FRAME`,
        applied by `run_pre_llm`) for a pre-LLM method that does not select along time itself."""
        return self.params + ((PER_FRAME,) if self.stage != "llm" and not self.video else ())

    @property
    def param_names(self) -> tuple[str, ...]:
        """The names of its `options`."""
        return tuple(p.name for p in self.options)

    def param(self, name: str) -> Param:
        for p in self.options:
            if p.name == name:
                return p
        raise did_you_mean(f"parameter of {self.name!r}", name, list(self.param_names))

    def defaults(self) -> dict[str, Any]:
        """{parameter: default} (a fresh dict)."""
        return {p.name: p.default for p in self.options}

    def bind(self, params: dict, *, strict: bool = True) -> dict[str, Any]:
        """The method's parameters from `params`, validated. strict: unknown names raise TypeError;
        otherwise they are ignored (one dict of app settings serves every method)."""
        unknown = sorted(set(params) - set(self.param_names))
        if strict and unknown:
            raise TypeError(f"{self.name!r} got unknown keyword argument(s) {unknown}; "
                            f"it accepts {sorted(self.param_names)}")
        return {p.name: p.validate(params[p.name]) for p in self.options if p.name in params}


def register_pruner(name: str, *, stage: str = "projector", needs: tuple[str, ...] = (),
                    params: tuple[Param, ...] = (), label: str = "", is_mi: bool = False,
                    answer: Callable | None = None, score_label: str | None = "score", adaptive: bool = False,
                    encoder_layer: int | None = None, capture: "capture_rules.Capturable | None" = None,
                    video: bool = False):
    """Decorator registering `fn` as method `name`.

    Pre-LLM methods (stage "projector"/"vision"): `fn(visual, text, budget, *, <inputs>, <params>)`;
    stage "llm": `fn(adapter, encoded, budget, *, cache, <params>)` and `answer(adapter, encoded,
    selection, *, max_new_tokens, cache, ...)` runs the LLM on its selection. Every keyword of
    `fn` beyond those is a declared `Param` whose default equals the signature's (checked here).
    adaptive: the method chooses K per input with the budget as its cap (it keeps between 1 and K);
    the run-time contract, the checker and every front end accept that and show the K chosen.
    encoder_layer: the vision-encoder block whose attention / keys / per-head attention it reads
    (None: the adapter's default block; -1: the last block; see `signals.py`). Signals are asked for
    by naming them in `needs` or taking their keywords (`attention_heads=`: (H, N[+1], N[+1]) float32;
    `features=`: (N_V, d_vision) pre-projector features).
    capture: a `capture.Capturable` when the selection is one capturable computation (no host sync, no
    data-dependent Python control flow) under its stated conditions: on CUDA it is then replayed as a CUDA
    graph, and with `batch` B equal-shape inputs run as one batched call (`batched.prune_batch`).
    video: it selects along time (takes `frame_index`); every other pre-LLM method gets `per_frame.PER_FRAME`.
    """

    def deco(fn: Callable[..., Selection]) -> Callable[..., Selection]:
        if name in METHODS.current():
            raise DuplicateNameError(name)
        if stage not in STAGES:
            raise ValueError(f"{name!r}: stage must be one of {STAGES}, got {stage!r}")
        bad = sorted(set(needs) - set(NEEDS))
        if bad:
            raise ValueError(f"{name!r}: unknown needs {bad}; known: {NEEDS}")
        layer = check_layer(encoder_layer)
        if capture is not None and (stage == "llm" or not isinstance(capture, capture_rules.Capturable)):
            raise ValueError(f"{name!r}: capture= takes a mipruner.pruners.capture.Capturable, for a pre-LLM method")
        if stage == "llm" and answer is None:
            raise ValueError(f"{name!r}: an in-LLM method needs answer=")
        sig = inspect.signature(fn)
        if PER_FRAME.name in sig.parameters or any(p.name == PER_FRAME.name for p in params):
            raise ValueError(f"{name!r}: 'per_frame' is the runner's option of every pre-LLM method, not its own")
        if video and stage != "llm" and "frame_index" not in sig.parameters:  # an in-LLM one reads run.frame_index
            raise ValueError(f"{name!r}: video=True is for a method that takes frame_index= (or an in-LLM one)")
        positional = ("adapter", "encoded", "budget") if stage == "llm" else ("visual", "text", "budget")
        declared = {p.name: p for p in params}
        for k, p in sig.parameters.items():
            if k in positional or k in INPUTS:
                continue
            if k not in declared:
                raise ValueError(f"{name!r}: keyword {k!r} of {fn.__name__} is not a declared Param")
            if p.default != declared[k].default:
                raise ValueError(f"{name!r}: {k} defaults to {p.default!r} in the signature but "
                                 f"{declared[k].default!r} in its Param")
        missing = sorted(set(declared) - set(sig.parameters))
        if missing:
            raise ValueError(f"{name!r}: Params {missing} are not keywords of {fn.__name__}")
        for p in params:  # a parameter name means one thing across methods (one control in the app)
            for other in METHODS.current().values():
                for q in other.params:
                    if q.name == p.name and q != p:
                        raise ValueError(f"{name!r}: Param {p.name!r} differs from {other.name!r}'s; "
                                         "one name, one definition")
        inputs = tuple(k for k in INPUTS if k in sig.parameters)
        if layer is not None and not {"attention", "keys", "attention_heads"} & (set(needs) | set(inputs)):
            raise ValueError(f"{name!r}: encoder_layer={layer} names the block of its attention/keys, but it reads "
                             "neither (name them in needs= or take them as keywords)")
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        METHODS.register(name, MethodSpec(name, fn, stage, frozenset(needs), tuple(params), label or name,
                                          doc[0] if doc else "", is_mi, answer, score_label=score_label, video=video,
                                          adaptive=adaptive, inputs=inputs, encoder_layer=layer, capture=capture,
                                          builtin=str(getattr(fn, "__module__", "")).split(".")[0] == "mipruner"))
        return fn

    return deco


def unregister_pruner(name: str) -> None:
    """Remove method `name` (for tests and plug-ins that register temporarily)."""
    METHODS.unregister(name)


def list_pruners(stage: str | None = None) -> list[str]:
    """Names of the registered methods (all, or those of one stage), sorted."""
    return sorted(s.name for s in METHODS.values() if stage is None or s.stage == stage)


def get_pruner(name: str) -> MethodSpec:
    """The registry entry for `name`; unknown names raise ValueError with "did you mean"."""
    return METHODS.get(name)


def all_params() -> dict[str, Param]:
    """Every registered parameter by name (one definition per name), in registration order; `per_frame` last."""
    out: dict[str, Param] = {}
    for p in sorted((p for spec in METHODS.values() for p in spec.options), key=lambda p: p.name == "per_frame"):
        out.setdefault(p.name, p)
    return out


def prune(name: str, *, visual: torch.Tensor, text: torch.Tensor | None = None,
          budget: int | float, **params) -> Selection:
    """Select `budget` visual tokens with pre-LLM method `name`.

    visual: (N_V, d) projected visual tokens; text: (N_T, d) prompt embeddings (text-conditioned
    methods); budget: int in [1, N_V] (tokens) or float in (0, 1] (share of N_V, rounded half up,
    at least 1). A budget above N_V raises: we never clip silently. Method parameters
    (`lam`, `tau`, `seed`, ...) and inputs (`attention`, `keys`, `cache`, ...) are keyword-only;
    unknown ones raise TypeError, out-of-range ones ValueError. On CUDA a built-in method's selection is
    recorded as a CUDA graph once per (method, K, parameters, shapes) and replayed (`capture.py`).
    """
    spec = get_pruner(name)
    if spec.stage == "llm":
        raise ValueError(f"{name!r} selects inside the LLM: use mipruner.select(adapter, encoded, {name!r}, budget)")
    inputs = {k: v for k, v in params.items() if k in INPUTS}
    bad_inputs = sorted(k for k in inputs if k not in spec.accepts)
    if bad_inputs:
        raise TypeError(f"prune({name!r}) got unknown keyword argument(s) {bad_inputs}; "
                        f"{name!r} accepts {sorted((*spec.accepts, *spec.param_names))}")
    kw = spec.bind({k: v for k, v in params.items() if k not in INPUTS})
    return run_pre_llm(spec, visual, text, budget, inputs, kw)


def run_pre_llm(spec: MethodSpec, visual: torch.Tensor, text: torch.Tensor | None, budget, inputs: dict,
                kw: dict) -> Selection:
    """Pre-LLM method `spec` on tensors, its parameters `kw` already bound (`MethodSpec.bind`) and
    its `inputs` already checked: what `prune` and `mipruner.select` share once they have validated
    what they were given. Checks the tensors, resolves the budget, checks a plug-in's selection."""
    check_tensors(spec, visual, text)
    n_v = visual.shape[0]
    k = resolve_budget(budget, n_v)
    split, kw = kw.get("per_frame", "off"), {n: v for n, v in kw.items() if n != "per_frame"}
    if split != "off":  # each frame alone, its share of the budget (`per_frame.py`)
        def one_frame(v: torch.Tensor, kk: int, inp: dict) -> Selection:
            part = capture_rules.run(spec, kk, dict(visual=v, text=text, **inp), kw)
            if spec.checked:  # a plug-in's or a script's selection of each frame is checked before it is joined
                check_plugin_selection(spec, part, v.shape[0], kk, v.device)
            return part
        sel = run_frames(one_frame, visual, k, inputs, split, own=spec.inputs)
    else:
        own = {n: inputs[n] for n in spec.inputs if n in inputs}  # frame_index only where the function takes it
        sel = capture_rules.run(spec, k, dict(visual=visual, text=text, **own), kw)
    if spec.checked:  # a plug-in's or a script's selection is checked before anything reads it
        check_plugin_selection(spec, sel, n_v, k, visual.device)
    sel.method = spec.name
    return sel


def check_tensors(spec: MethodSpec, visual: torch.Tensor, text: torch.Tensor | None) -> None:
    """ValueError when `visual` / `text` are not what pre-LLM method `spec` takes (shapes, types, values;
    within `values_checked()` shapes and types only)."""
    name = spec.name
    check_matrix("visual", visual)
    if visual.shape[0] == 0:
        raise ValueError("visual has no tokens (N_V = 0)")
    if spec.needs_text:
        if text is None:
            raise ValueError(f"{name!r} is text-conditioned: pass text=(N_T, d) prompt embeddings")
        check_matrix("text", text)
        if text.shape[0] == 0:
            raise ValueError(f"text is empty (N_T = 0); {name!r} needs at least one text token")
        if text.shape[1] != visual.shape[1]:
            raise ValueError(f"width mismatch: visual has d={visual.shape[1]}, text has d={text.shape[1]}; "
                             "both must live in the LLM's input space")


class ContractError(ValueError):
    """A method's selection breaks the contract (`failure`: what, one sentence); every method but mipruner's
    own is checked (`MethodSpec.checked`)."""

    def __init__(self, spec: "MethodSpec", failure: str):
        super().__init__(f"{spec.name!r}, a method of {spec.source}, broke the selection contract: {failure}")
        self.failure = failure


def adaptive_k(spec: "MethodSpec", sel: Any, k: int) -> int:
    """The K a selection is checked against: the budget, or for an adaptive method the K it chose
    when that lies in [1, budget] (the budget is its cap)."""
    if spec.adaptive and isinstance(sel, Selection) and isinstance(sel.keep, torch.Tensor) and 1 <= sel.budget <= k:
        return sel.budget
    return k


def check_plugin_selection(spec: "MethodSpec", sel: Any, n: int, k: int, device: torch.device) -> None:
    """ContractError naming the plug-in when `sel` breaks the selection contract (`selection_failures`);
    the size rule is the spec's (`selection.size_rule`: fixed K, adaptive 1..K, none only in the LLM)."""
    bad = selection_failures(sel, n=n, k=k, device=device, adaptive=spec.adaptive, stage=spec.stage)
    if bad:
        raise ContractError(spec, bad[0])


PrunerSpec = MethodSpec  # its public name (`mipruner.PrunerSpec`), kept for code written against it
