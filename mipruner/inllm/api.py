"""The public API for methods that prune inside the language model (stage "llm").

A method declares, in one decorated function, at which decoder layer(s) it acts, what it reads
there and what each stage keeps; mipruner runs the layers (for every family that runs FastV),
records the stages on the `Selection` and replays them for the answer, in the app, the
evaluation, the sweeps and the lmms-eval model, without patching transformers (a method in a few
lines: docs/plugins.md, "In-LLM methods: the stage API").

`run` is a `DecoderRun` (one per selection); `run.at(K)` runs the decoder up to layer K on the
rows the earlier stages left and returns a `StageView` of the sequence entering layer K;
`run.keep(view, visual, merge=...)` says which visual tokens (indices into the encoding's N_V)
stay from layer K on, and optionally which dropped rows are filled with merged tokens. Call `at`
with ascending layers, one `keep` after each. The returned Selection's `keep` must be the visual
tokens the last stage keeps (what masks show; `budget` of them unless the method is adaptive).
A stage may keep none (`run.keep(view, [])`): every visual token is withdrawn from layer K on
and the text goes on alone; the selection's `keep` is then empty, at any budget, and
`extras["withdrawn_at"]` = K (masks, panels and eval say "all withdrawn from layer K"). `run.at(0)` is
a pre-LLM step (the input embeddings); `run.decode(layer, fn)` a decode-time stage (`DecodeStep`).

Positions (`positions=` of `register_inllm`): "original" (FastV's semantics: every remaining row
keeps its position) or "renumber" (each remaining row moves down by the rows dropped before it:
1-D positions become 0..L'-1, as PyramidDrop's and SparseVLM v1.5's `arange`; decoding continues
after them). Either way keeping every token is the unpruned model bit for bit.

Caching (`cache=`, one dict per encoding): the layers before a method's first stage run once per
(encoding, layer), shared by every method and budget; a selection is cached per (method, K, parameters);
the answer reuses the latest selection's layers, or a one-stage method's shared ones, else replays.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from ..pruners._registry import Param, register_pruner
from ..pruners.selection import Selection
from ._decode_stage import DecodeStage, DecodeStep

POSITIONS = ("original", "renumber")
QUERIES = ("last", "after", "text")
_LAST = "_staged_last"  # (stages, prefix) of the latest selection: the answer reuses its layers


@dataclass(frozen=True)
class Merge:
    """Merged tokens a stage writes: from the stage's layer on, the rows `rows` (M,) (sequence
    positions of visual rows the stage drops) hold the mean of the hidden states entering the
    layer at `members` (P,) (sequence positions present before the stage), member p going to
    merged token `of[p]` in [0, M). A merged row keeps its slot's position."""

    rows: torch.Tensor
    members: torch.Tensor
    of: torch.Tensor


class StageView:
    """The sequence entering decoder layer `layer`, before the stage drops anything.

    rows (L_cur,): ascending sequence positions present (every one at the first stage);
    visual (n,): indices into the N_V visual tokens of the ORIGINAL visual tokens present;
    merged (m,): sequence positions of the merged tokens present (made by the previous stage).
    Every read takes and returns sequence positions / columns of `rows` (`columns`).
    """

    def __init__(self, run: "DecoderRun", prefix):
        self._run, self._prefix = run, prefix
        self.layer = prefix.layer
        p = run._prompt
        self.rows = prefix.rows if prefix.rows is not None else torch.arange(p.length, device=p.embeds.device)
        vis = p.visual_positions
        last = prefix.stages[-1] if prefix.stages else None
        self.merged = last.merge_rows.to(vis.device) if last is not None and last.merge_rows is not None \
            else vis[:0]
        self.present = torch.isin(vis, self.rows) & ~torch.isin(vis, self.merged)  # (N_V,) bool, no host sync
        self._visual = None

    @property
    def visual(self) -> torch.Tensor:
        """(n,) indices into N_V of the original visual tokens present, ascending (`present`'s)."""
        if self._visual is None:
            self._visual = torch.nonzero(self.present).flatten()
        return self._visual

    def columns(self, positions: torch.Tensor) -> torch.Tensor:
        """Where sequence `positions` sit among `rows` (they must be present)."""
        positions = positions.to(self.rows.device)
        return positions if self._prefix.rows is None else torch.searchsorted(self.rows, positions)

    def _queries(self, queries) -> torch.Tensor:
        run = self._run
        if isinstance(queries, str):
            if queries not in QUERIES:
                raise ValueError(f"queries must be one of {QUERIES} or sequence positions, got {queries!r}")
            queries = {"last": torch.tensor([run.length - 1], device=self.rows.device), "after": run.text_after,
                       "text": run.text_positions}[queries]
        return self.columns(queries)

    def attention(self, queries="last", *, layer: str = "previous", heads: bool = False) -> torch.Tensor:
        """Head-mean attention probabilities (R, L_cur) float32 of R query rows over the rows present;
        heads=True: per head, (H, R, L_cur) float32 in the model's head order, so the mean, the
        maximum or any other statistic over heads is the method's choice. Nothing is recorded for
        it in advance: it is computed when asked for, from the query inputs and keys the stage
        holds anyway, and takes H * R * L_cur * 4 bytes (twice that while the softmax runs).

        queries: "last" (the last prompt token), "after" (the prompt tokens after the last visual
        token), "text" (every non-visual token) or (R,) sequence positions. layer: "previous", the
        attention layer K-1 computed (from its own q_proj / q_norm, rotary and the keys it cached:
        FastV, SparseVLM); or "this", the attention layer K would compute on this input before any
        drop (its input norm, q/k projections and norms, rotary: PyramidDrop). Causal and sliding-
        window masks as the layer's; grouped-query heads read their KV head.
        """
        from ._probe import last_token_attention, layer_attention, rater_attention

        if self.layer == 0:
            raise ValueError("a stage at layer 0 (before the LLM) reads no attention: read view.hidden(...), "
                             "the LLM's input embeddings")
        idx = self._queries(queries)
        if layer == "this":
            block = self._run._prompt.lm.layers[self.layer]
            return layer_attention(block, self._prefix.hidden, self._cos_sin(), idx, self._window(self.layer),
                                   per_head=heads)
        if layer != "previous":
            raise ValueError(f"layer must be 'previous' or 'this', got {layer!r}")
        p = self._prefix.probe
        attn = self._run._prompt.lm.layers[self.layer - 1].self_attn
        if isinstance(queries, str) and queries == "last" and not heads:  # FastV's row, computed as it always was
            x, (cos, sin) = p["query_input"], p["cos_sin"]
            return last_token_attention(attn, x.index_select(1, idx), (cos.index_select(-2, idx),
                                        sin.index_select(-2, idx)), p["keys"], p["window"])[None]
        x, (cos, sin) = p["query_input"], p["cos_sin"]
        return rater_attention(attn, x.index_select(1, idx), (cos.index_select(-2, idx), sin.index_select(-2, idx)),
                               p["keys"], idx, p["window"], per_head=heads)

    def _cos_sin(self):
        from ._decoder import row_inputs

        return row_inputs(self._run._prompt, self._prefix)[0]

    def _window(self, i: int):
        from ._decoder import layer_kind

        cfg = self._run._prompt.lm.config
        return getattr(cfg, "sliding_window", None) if layer_kind(cfg, i) == "sliding_attention" else None

    def hidden(self, positions: torch.Tensor | None = None, *, normed: bool = False) -> torch.Tensor:
        """Hidden states entering layer K, (len(positions), d) in the model's dtype (all rows when
        None); normed: after the model's final norm (as DART reads them)."""
        h = self._prefix.hidden[0]
        if normed:
            memo = self._prefix.memo
            if "normed" not in memo:
                memo["normed"] = self._run._prompt.lm.norm(self._prefix.hidden)[0]
            h = memo["normed"]
        return h if positions is None else h.index_select(0, self.columns(positions))

    def key_norms(self, positions: torch.Tensor | None = None) -> torch.Tensor:
        """(len(positions),) float32 L1 norm of each row's keys at layer K-1 (post-norm, post-rotary,
        KV heads concatenated), as DART ranks its pivots."""
        memo = self._prefix.memo
        if self.layer == 0:
            raise ValueError("a stage at layer 0 (before the LLM) has no keys yet: read view.hidden(...)")
        if "key_l1" not in memo:
            memo["key_l1"] = self._prefix.probe["keys"][0].float().abs().sum(dim=(0, 2))
        k = memo["key_l1"]
        return k if positions is None else k.index_select(0, self.columns(positions))


class DecoderRun:
    """One in-LLM selection's walk through the decoder (see the module docstring).

    n_layers, n_visual, length (L): the decoder's depth, the encoding's N_V, the prompt's length.
    visual_positions (N_V,): sequence position of each visual token (ascending); text_positions:
    every other one; text_after: those after the last visual token; embeddings(positions): the
    LLM input embeddings (len, d) of those rows.
    """

    def __init__(self, prompt, cache: dict | None, positions: str, encoded=None):
        self._prompt, self._cache, self._renumber = prompt, cache, positions == "renumber"
        self._encoded = encoded
        self.decode_stage: DecodeStage | None = None
        self.n_layers, self.length = prompt.n_layers, prompt.length
        vis = prompt.visual_positions
        self.visual_positions, self.n_visual = vis, int(vis.numel())
        mask = torch.ones(prompt.length, dtype=torch.bool, device=vis.device)
        mask[vis] = False
        self.text_positions = torch.nonzero(mask).flatten()
        self.text_after = torch.arange(int(vis.max()) + 1, prompt.length, device=vis.device)
        self.stages: list = []
        self._checks: list = []  # (bool tensor, sentence): read once, at the end (one host sync per selection)
        self._prefix = None
        self._kv = None
        self._open: StageView | None = None

    def _failure(self) -> str | None:
        """The first failed check's sentence (one host read for all of them), or None."""
        if not self._checks:
            return None
        ok = torch.stack([c for c, _ in self._checks]).cpu()
        bad = [msg for (_, msg), good in zip(self._checks, ok.tolist()) if not good]
        return bad[0] if bad else None

    @property
    def frame_index(self) -> torch.Tensor:
        """(N_V,) int64 frame of each visual token, -1 of none (`Encoded.frame_index`; 0 for an image)."""
        if self._encoded is None:
            return torch.zeros(self.n_visual, dtype=torch.long, device=self.visual_positions.device)
        return self._encoded.frame_index.to(self.visual_positions.device)

    def decode(self, layer: int, fn: Callable[["DecodeStep"], torch.Tensor | None]) -> None:
        """A decode-time stage (one per method, 1 <= layer < depth): at each decoding step after the first
        token `fn(step: DecodeStep)` returns the (N_V,) bool visual tokens the layers from `layer` on attend
        to (None: all present); the others are masked over the KV cache, not deleted."""
        from ._run import _int

        if self.decode_stage is not None:
            raise ValueError("run.decode is called once per method (one decode-time stage)")
        if not callable(fn):
            raise ValueError(f"run.decode takes a function of the step, got {type(fn).__name__}")
        layer = _int("decode layer", layer, 1, self.n_layers - 1)
        self.decode_stage = DecodeStage(layer, fn)

    def embeddings(self, positions: torch.Tensor) -> torch.Tensor:
        return self._prompt.embeds[0].index_select(0, positions.to(self._prompt.embeds.device))

    def at(self, layer: int) -> StageView:
        """Run the decoder up to layer `layer` (0 <= layer <= depth, above the last stage's) and return
        the view of its input; layer 0: the input embeddings (no attention or keys), a pre-LLM drop."""
        from ._decoder import advance, prefill_cache, start
        from ._run import _int, _prefix

        if self._open is not None:
            raise ValueError(f"stage at layer {self._open.layer}: call run.keep(view, ...) before the next run.at")
        if self._prefix is None and layer == 0 and not isinstance(layer, bool):
            self._open = StageView(self, start(self._prompt))
            return self._open
        lo = 1 if self._prefix is None else self._prefix.layer + 1
        if self._prefix is not None and isinstance(layer, int) and not isinstance(layer, bool) and layer < lo:
            raise ValueError(f"stages must ascend: run.at({layer}) comes after the stage at layer {self._prefix.layer}; "
                             f"the next stage's layer must be in [{lo}, {self.n_layers}]")
        layer = _int("layer", layer, lo, self.n_layers)
        if self._prefix is None:
            prefix = _prefix(self._prompt, layer, self._cache)  # shared per (encoding, layer)
        else:
            if self._kv is None:
                self._kv = prefill_cache(self._prompt, self._prefix)
            prefix = advance(self._prompt, self._prefix, layer, cache=self._kv, probe="all")
        self._open = StageView(self, prefix)
        return self._open

    def keep(self, view: StageView, visual: torch.Tensor, *, merge: Merge | None = None) -> None:
        """From the view's layer on only the text rows, the visual tokens `visual` (indices into N_V,
        among `view.visual`) and `merge.rows` remain; `merge` fills those with merged tokens."""
        from ._decoder import Stage, apply_stage

        if view is not self._open:
            raise ValueError("run.keep takes the view the latest run.at returned")
        p = self._prompt
        vis = p.visual_positions
        dev = vis.device
        visual = torch.as_tensor(visual, device=dev).to(torch.long).flatten()
        where = f"stage at layer {view.layer}: "
        inside = (visual >= 0) & (visual < self.n_visual)
        self._checks.append((inside.all() & view.present[visual.clamp(0, self.n_visual - 1)].all(),
                             where + "keep names visual tokens that are not present"))
        mask = torch.zeros(p.length, dtype=torch.bool, device=dev)
        mask[view.rows] = True
        mask[vis] = False  # text rows stay; visual rows only when kept
        mask[vis[visual.clamp(0, self.n_visual - 1)]] = True
        m = (None, None, None)
        if merge is not None and merge.rows.numel():
            m = tuple(t.to(dev).to(torch.long) for t in (merge.rows, merge.members, merge.of))
            self._checks.append((~mask[m[0]].any() & torch.isin(m[0], vis).all(),
                                 where + "merged rows must be dropped visual rows"))
            mask[m[0]] = True
        stage = Stage(view.layer, torch.nonzero(mask).flatten(), *m, renumber=self._renumber)
        self._prefix = apply_stage(p, view._prefix, stage)
        self.stages.append(stage)
        self._open = None


def _staged_select(name: str, fn: Callable, positions: str, adapter, encoded, budget, cache, params) -> Selection:
    from ._run import _get_prompt

    prompt = _get_prompt(adapter, encoded, cache)
    k = budget  # an int in [1, N_V]: mipruner.select resolved it
    key = ("selection", name, k, tuple(sorted(params.items())))
    if cache is not None and key in cache:
        sel = cache[key]
        return dataclasses.replace(sel, extras=dict(sel.extras))
    run = DecoderRun(prompt, cache, positions, encoded)
    try:
        sel = fn(run, k, **params)
    except Exception as e:
        msg = run._failure()
        if msg is not None:
            raise ValueError(f"{name!r}: {msg}") from e
        raise
    if run._open is not None or not (run.stages or run.decode_stage):
        raise ValueError(f"{name!r}: every run.at needs a run.keep (and at least one stage or a run.decode)")
    last = run.stages[-1] if run.stages else None
    vis = prompt.visual_positions
    kept = torch.isin(vis, last.rows) if last is not None else torch.ones_like(vis, dtype=torch.bool)
    if last is not None and last.merge_rows is not None:
        kept &= ~torch.isin(vis, last.merge_rows.to(vis.device))
    if isinstance(sel, Selection):
        shown = torch.zeros_like(kept)
        shown[sel.keep.to(vis.device)] = True
        run._checks.append(((shown == kept).all(),
                            "the selection's keep is not the visual tokens its last stage keeps"))
    msg = run._failure()
    if msg is not None:
        raise ValueError(f"{name!r}: {msg}")
    if isinstance(sel, Selection):
        sel.extras["stages"] = tuple(run.stages)
        if run.decode_stage is not None:
            sel.extras["decode"] = run.decode_stage
        sel.extras.setdefault("layer", last.layer if last is not None else 0)
        n_text = prompt.length - run.n_visual
        gone = [s.layer for s in run.stages if int(s.rows.numel()) == n_text]  # no visual row left (one read each)
        if gone:
            sel.extras["withdrawn_at"] = gone[0]
        if cache is not None:
            cache[key] = sel
            if run._prefix is not None:
                cache[_LAST] = (tuple(run.stages), run._prefix)
        sel = dataclasses.replace(sel, extras=dict(sel.extras))
    return sel


def register_inllm(name: str, *, label: str = "", params: tuple[Param, ...] = (), score_label: str | None = "score",
                   positions: str = "original", adaptive: bool = False, video: bool = False):
    """Register `fn(run: DecoderRun, budget: int, **params) -> Selection` as in-LLM method `name`.

    params: its `Param`s (keywords of fn, defaults equal); positions: "original" or "renumber"
    (module docstring); adaptive: the method chooses K per input, the budget as its cap (it may
    keep fewer); video: it selects along time (reads `run.frame_index`, needs 2+ frames: the checker gives it
    a video, the app offers it on videos). The method is then used like every other: `mipruner.select`, `mipruner.answer`,
    the app, `python -m mipruner.eval`, the sweeps, the lmms-eval model, the checker.
    """
    if positions not in POSITIONS:
        raise ValueError(f"{name!r}: positions must be one of {POSITIONS}, got {positions!r}")

    def deco(fn: Callable[..., Selection]) -> Callable[..., Selection]:
        sig = inspect.signature(fn)
        own = [p for k, p in sig.parameters.items() if k not in ("run", "budget")]

        @functools.wraps(fn)
        def method(adapter, encoded, budget, *, cache: dict | None = None, **kw) -> Selection:
            return _staged_select(name, fn, positions, adapter, encoded, budget, cache, kw)

        P = inspect.Parameter
        method.__signature__ = sig.replace(parameters=[
            P("adapter", P.POSITIONAL_OR_KEYWORD), P("encoded", P.POSITIONAL_OR_KEYWORD),
            P("budget", P.POSITIONAL_OR_KEYWORD), P("cache", P.KEYWORD_ONLY, default=None),
            *[p.replace(kind=P.KEYWORD_ONLY) for p in own]])
        method.inllm_positions = positions
        from ._run import answer

        register_pruner(name, stage="llm", needs=("adapter",), params=params, label=label, answer=answer,
                        score_label=score_label, video=video, **({"adaptive": True} if adaptive else {}))(method)
        return method

    return deco


def prefill_logits(adapter, encoded, selection: Selection) -> torch.Tensor:
    """Logits (L', vocab), float32 on the CPU, of one forward pruned as an in-LLM selection's
    stages say: one row per prompt row left after the last stage, in prompt order."""
    from ._run import staged_prefill_logits

    return staged_prefill_logits(adapter, encoded, selection)


__all__ = ["DecodeStage", "DecodeStep", "DecoderRun", "Merge", "POSITIONS", "QUERIES", "StageView", "prefill_logits", "register_inllm"]
