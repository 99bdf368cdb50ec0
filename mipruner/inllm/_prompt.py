"""The unpruned LLM input of one encoding with the decoder that runs it: a `Prompt`.

`prompt_of(adapter, encoded)` asks the adapter for its LLM input (`Adapter.llm_inputs`: the full
input embeddings, the positions the rotary embedding and the layers see, where the visual tokens
sit, the Qwen3-VL deepstack features, the first decoding position) and its decoder's public
submodules (`Adapter.text_decoder`: `embed_tokens`, `rotary_emb`, `layers`, `norm`; the output
head). Nothing here runs a decoder layer; `_decoder.py` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..models.base import Encoded


@dataclass
class Prompt:
    """Everything needed to run the decoder layers by hand on one encoding (batch size 1).

    lm: the text decoder module; head: the output projection (lm_head).
    embeds: (1, L, d) input embeddings of the full prompt.
    rope_positions: (1, L) or (3, 1, L) positions fed to `lm.rotary_emb`.
    layer_positions: (1, L) position ids the layers and the mask builder see, or None (Qwen).
    visual_positions: (N_V,) sequence index of each visual token, ascending.
    next_position: the position of the first generated token.
    deepstack: Qwen3-VL only: per injected layer i, (N_V, d) added to the visual rows after layer i.
    eos: token ids that end generation.
    """

    lm: Any
    head: Any
    embeds: torch.Tensor
    rope_positions: torch.Tensor
    layer_positions: torch.Tensor | None
    visual_positions: torch.Tensor
    next_position: int
    eos: tuple[int, ...]
    deepstack: list[torch.Tensor] | None = None
    max_positions: int = 0

    @property
    def length(self) -> int:
        return int(self.embeds.shape[1])

    @property
    def n_layers(self) -> int:
        return len(self.lm.layers)

    def kept_sequence(self, keep: torch.Tensor | None) -> torch.Tensor:
        """(L',) ascending sequence indices that remain: every non-visual token + the kept visual
        tokens (`keep` indexes the N_V visual tokens; None keeps all)."""
        device = self.embeds.device
        if keep is None:
            return torch.arange(self.length, device=device)
        mask = torch.ones(self.length, dtype=torch.bool, device=device)
        mask[self.visual_positions] = False
        mask[self.visual_positions[keep.to(device)]] = True
        return torch.nonzero(mask).flatten()

    def step_positions(self, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rope positions, layer positions) of one generated token at `position`."""
        device = self.embeds.device
        rope = torch.full((*self.rope_positions.shape[:-1], 1), position, dtype=torch.long, device=device)
        layer = None if self.layer_positions is None else rope.view(1, 1)
        return rope, layer


def _eos(generation_config) -> tuple[int, ...]:
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)


def prompt_of(adapter, encoded: Encoded) -> Prompt:
    """The unpruned LLM input of `encoded` (`adapter.llm_inputs`) with the decoder to run it.

    NotImplementedError for adapters without a decoder to drive (e.g. the dummy adapter).
    """
    try:
        lm = adapter.text_decoder()
        x = adapter.llm_inputs(encoded)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"in-LLM pruning (FastV, DART) needs a transformers decoder to drive: {e}. "
            "Supported: LLaVA-1.5, LLaVA-NeXT, Video-LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen3-VL") from None
    return Prompt(lm=lm, head=adapter.output_head(), embeds=x.embeds, rope_positions=x.rope_positions,
                  layer_positions=x.layer_positions, visual_positions=x.visual_positions,
                  next_position=x.next_position, eos=_eos(adapter.model.generation_config), deepstack=x.deepstack,
                  max_positions=int(getattr(lm.config, "max_position_embeddings", 0) or 0))
