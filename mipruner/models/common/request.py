"""The typed per-request state an encoding carries for its adapter (`Encoded.state`), as vLLM's
`CachedRequestState` types what its runner keeps per request: `RequestState` holds what every family
has (the unpruned prompt's ids, where its visual tokens sit, the templated prompt), each family's
subclass what only it needs (`ProcessorState`: the processor's plain-model inputs; `QwenState`: M-RoPE
positions, the vision inputs, Qwen3-VL's deepstack). Only `mipruner/models/` reads it; what the rest of
the library needs of it is an `Encoded` property (`Encoded.prompt_tokens`).

`extra` holds a family's raw records that nothing decodes from (e.g. LLaVA-NeXT's per-view attention).
A field is read as an attribute (`state.input_ids`), an `extra` record from that dict (`state.extra["name"]`):
one name, one way to read it (no string-keyed lookup beside the fields).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(kw_only=True)
class RequestState:
    """input_ids: the unpruned prompt's token ids, visual placeholders included ((L,) or (1, L));
    visual_positions: (N_V,) each visual token's index in it; templated: the prompt after the chat template."""

    input_ids: torch.Tensor
    visual_positions: torch.Tensor
    templated: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        """The unpruned prompt's length in tokens (visual tokens included)."""
        return int(self.input_ids.numel())


@dataclass(kw_only=True)
class ProcessorState(RequestState):
    """The processor-fed families (LLaVA, OneVision, InternVL): `ref`, the plain model's own inputs
    (what `model(**ref)` / `model.generate(**ref)` takes for the unpruned prompt)."""

    ref: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class QwenState(RequestState):
    """Qwen2/2.5/3-VL: input_ids (1, L); the M-RoPE positions (3, 1, L) and rope_deltas computed once on
    the unpruned sequence; mm_token_type_ids; modality ("image" / "video"); the vision inputs and the rope
    keyword arguments; the sampled frames and their indices; frame_groups (videos: token-frame -> its
    frames); deepstack (Qwen3-VL: one (N_V, d) tensor per injected layer)."""

    positions: torch.Tensor
    rope_deltas: torch.Tensor
    mm_token_type_ids: torch.Tensor
    modality: str
    vision_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    rope_kwargs: dict[str, Any] = field(default_factory=dict)
    sampled_frames: list = field(default_factory=list)
    frame_indices: list[int] = field(default_factory=list)
    frame_groups: list[list[int]] | None = None
    deepstack: list[torch.Tensor] | None = None


__all__ = ["ProcessorState", "QwenState", "RequestState"]
