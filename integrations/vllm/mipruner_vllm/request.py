"""One request's pruning, read from vLLM's `mm_processor_kwargs` and checked in the front end.

Keys (all optional; without `mipruner_method` nothing is pruned):
  mipruner_method  a registered pre-LLM method with a fixed count ("mi", "random", "similarity",
                   "divprune", "cdpruner", "pool", or one a plug-in registered with `register_pruner`;
                   on a video also "vidcom2" and "evs", whose count the grid fixes: COUNT_FROM_GRID)
  mipruner_budget  tokens kept per image or video: an int in [1, N], or a float in (0, 1], a share of N
  mipruner_query   the words the text-reading methods score against (vLLM hands the multimodal
                   processor no prompt, so the client sends them; they enter vLLM's item hash)
  mipruner_<param> any parameter of the method, e.g. mipruner_lam=0.5, mipruner_seed=3 (the MI family's
                   lam follows mipruner.select's rule, read from mipruner_query, unless given)

`parse` validates everything (a ValueError naming the field: vLLM answers HTTP 400 and keeps
serving); `PruneRequest.to_tensor` carries the checked request to the worker as bytes, since vLLM's
per-item fields are tensors.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from mipruner.pruners._registry import get_pruner
from mipruner.pruners.evs import retained_count
from mipruner.pruners.lam_rule import resolve_lam
from mipruner.pruners.selection import resolve_budget

PREFIX = "mipruner_"
METHOD, BUDGET, QUERY = PREFIX + "method", PREFIX + "budget", PREFIX + "query"
# Encoding inputs this integration gives a method: the token grid (pool) and, for a video, each token's frame.
GIVEN_INPUTS = frozenset({"grid", "cache", "frame_index"})
# Adaptive methods whose count is a function of the media's token grid alone, known before scheduling:
# EVS keeps min(budget, vLLM's compute_retained_tokens_count(P, T, rate)) (mipruner.pruners.evs).
COUNT_FROM_GRID = frozenset({"evs"})


def strip(kwargs) -> dict:
    """`kwargs` without this plug-in's keys (what vLLM's HF processor should see)."""
    return {k: v for k, v in kwargs.items() if not str(k).startswith(PREFIX)}


def why_not(name: str, medium: str = "any") -> str | None:
    """None when method `name` runs inside vLLM here on `medium` ("image", "video" or "any"), else the
    sentence saying why it cannot."""
    try:
        spec = get_pruner(name)
    except (LookupError, ValueError) as e:  # an unknown name, with mipruner's "did you mean"
        raise ValueError(f"mipruner_method: {e.args[0] if e.args else e}") from None
    if spec.stage == "llm":
        return (f"mipruner_method {name!r} prunes inside the language model, between decoder layers; vLLM's paged "
                f"KV cache and its fixed placeholder counts cannot drop tokens there: use mipruner.select/answer")
    if spec.stage == "vision":
        return (f"mipruner_method {name!r} reads the vision encoder's attention ({', '.join(sorted(spec.needs))}), "
                f"which vLLM's fused attention kernels do not return: use a projector-stage method")
    if spec.video and medium == "image":
        return (f"mipruner_method {name!r} selects along time and needs a video; this request's media are images "
                f"(send the video, or an image method)")
    if spec.adaptive and name not in COUNT_FROM_GRID:
        return (f"mipruner_method {name!r} chooses its own token count after the encoder runs, but vLLM fixes each "
                f"image's placeholder count before scheduling: use a method with a fixed count")
    missing = sorted(set(spec.needs) - {"text"}) + sorted(set(spec.inputs) - GIVEN_INPUTS)
    if missing:
        return f"mipruner_method {name!r} needs {', '.join(missing)}, which this vLLM integration does not provide"
    return None


@dataclass(frozen=True)
class PruneRequest:
    method: str
    budget: int | float
    params: dict = field(default_factory=dict)
    query_ids: tuple[int, ...] = ()

    def k(self, n: int, frames: int = 1) -> int:
        """Tokens kept of a medium of `n` tokens in `frames` frames (mipruner's own rule: `resolve_budget`;
        EVS at a rate q > 0: also at most vLLM's retained count, as `mipruner.pruners.evs`)."""
        k = resolve_budget(self.budget, n)
        q = float(self.params.get("video_pruning_rate", 0.0)) if self.method in COUNT_FROM_GRID else 0.0
        return min(k, retained_count(n // frames, frames, q)) if q > 0 else k

    def to_tensor(self, n_items: int) -> torch.Tensor:
        """(n_items, L) uint8: this request as JSON, one row per image (all rows equal)."""
        raw = json.dumps({"method": self.method, "budget": self.budget, "params": self.params,
                          "query_ids": list(self.query_ids)}, sort_keys=True).encode()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).repeat(n_items, 1)

    @staticmethod
    def off_tensor(n_items: int) -> torch.Tensor:
        """(n_items, 2) uint8: "{}", no pruning for these images."""
        return torch.frombuffer(bytearray(b"{}"), dtype=torch.uint8).repeat(n_items, 1)

    @classmethod
    def from_tensor(cls, row: torch.Tensor) -> "PruneRequest | None":
        d = json.loads(bytes(row.to("cpu", torch.uint8).numpy()).decode())
        return cls(d["method"], d["budget"], d["params"], tuple(d["query_ids"])) if d else None


def parse(kwargs, tokenize) -> PruneRequest | None:
    """The request in `kwargs` (vLLM's mm_processor_kwargs), checked; None when it asks for no pruning.
    tokenize: str -> list[int], the model's tokenizer without special tokens."""
    ours = {k: v for k, v in kwargs.items() if str(k).startswith(PREFIX)}
    if not ours:
        return None
    method = ours.pop(METHOD, None)
    if method is None:
        raise ValueError(f"{', '.join(sorted(ours))} given without mipruner_method: name the method to prune with")
    if not isinstance(method, str):
        raise ValueError(f"mipruner_method must be a method name (a string), got {method!r}")
    reason = why_not(method)
    if reason:
        raise ValueError(reason)
    spec = get_pruner(method)
    if BUDGET not in ours:
        raise ValueError("mipruner_budget is missing: give the tokens to keep per image (an int) or a share (0, 1]")
    budget = ours.pop(BUDGET)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ValueError(f"mipruner_budget must be an int (tokens) or a float in (0, 1] (a share), got {budget!r}")
    try:  # the form here (an int >= 1, or a share in (0, 1]); the range against each image's N in check_budget
        resolve_budget(budget, 1 << 30)
    except ValueError as e:
        raise ValueError(f"mipruner_budget: {e}") from None
    query = ours.pop(QUERY, None)
    if query is not None and not isinstance(query, str):
        raise ValueError(f"mipruner_query must be a string, got {query!r}")
    ids = tuple(int(i) for i in tokenize(query)) if query else ()
    if "text" in spec.needs and not ids:
        raise ValueError(f"mipruner_method {method!r} scores the image against the prompt: give the question "
                         f"as mipruner_query (vLLM does not pass the prompt to the multimodal processor)")
    params = {k[len(PREFIX):]: v for k, v in ours.items()}
    try:
        bound = spec.bind(params)
    except TypeError as e:
        raise ValueError(f"mipruner_method {method!r}: {e}") from None
    if "lam_rule" in spec.param_names:  # the MI family's lam from the question, as mipruner.select does
        bound, _ = resolve_lam(bound, query or "", spec.param("lam").default)
    json.dumps(bound)  # plain values only (they travel as JSON)
    return PruneRequest(method, budget, bound, ids)


def check_budget(req: PruneRequest, n: int, frames: int = 1) -> int:
    """K for a medium of n tokens in `frames` frames; ValueError (naming mipruner_budget) when the budget exceeds n."""
    try:
        return req.k(n, frames)
    except ValueError as e:
        raise ValueError(f"mipruner_budget: {e}") from None
