"""The unpruned LLM input of one encoding, built exactly as the model's own forward builds it.

`prompt_of(adapter, encoded)` reads the adapter's `Encoded.state` and the model's public
submodules and returns a `Prompt`: the text decoder (`embed_tokens`, `rotary_emb`, `layers`,
`norm`), the output head, the full input embeddings, the positions the rotary embedding and the
decoder layers see, where the visual tokens sit, the Qwen3-VL deepstack features, and the first
decoding position. Nothing here runs a decoder layer; `_decoder.py` does.

Per family (what the model's forward does with the adapter's inputs, mirrored value for value):
  LLaVA-1.5 / LLaVA-NeXT / Video-LLaVA  `inputs_embeds` = the adapter's spliced prompt (keep all);
      positions 0..L-1 for the rotary embedding, the masks and the layers (what `LlamaModel`
      derives when none are passed); decoding continues at position L.
  Qwen2-VL / Qwen2.5-VL / Qwen3-VL  `embed_tokens(input_ids)` with the visual rows written at the
      placeholder positions (what `masked_scatter` does); the M-RoPE 3-D positions computed once
      by the adapter on the full sequence (`state["positions"]`); the layers and masks get no
      position ids (the text model passes none for 3-row positions); decoding continues at the
      UNPRUNED max position + 1. Qwen3-VL: `state["deepstack"]`, one (N_V, d) tensor per layer,
      added to the visual rows after the first decoder layers.
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
    """The unpruned LLM input of `encoded` for `adapter`'s family (see module doc).

    NotImplementedError for adapters without a decoder to drive (e.g. the dummy adapter).
    """
    from ..models._llava_common import LlavaFamilyAdapter
    from ..models.qwen2_vl import Qwen2VLAdapter

    if isinstance(adapter, LlavaFamilyAdapter):
        return _llava_prompt(adapter, encoded)
    if isinstance(adapter, Qwen2VLAdapter):
        return _qwen_prompt(adapter, encoded)
    raise NotImplementedError(
        f"in-LLM pruning (FastV, DART) needs a transformers decoder to drive; the "
        f"{getattr(adapter, 'family', '') or type(adapter).__name__!r} adapter has none. "
        f"Supported: LLaVA-1.5, LLaVA-NeXT, Video-LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen3-VL")


def _text_model(model):
    lm = model.model.language_model
    for name in ("embed_tokens", "rotary_emb", "layers", "norm"):
        if not hasattr(lm, name):
            raise NotImplementedError(f"the text decoder {type(lm).__name__} has no `{name}`: cannot drive it")
    return lm


def _llava_prompt(adapter, encoded: Encoded) -> Prompt:
    model = adapter.model
    lm = _text_model(model)
    embeds = adapter.pruned_inputs(encoded, None)["inputs_embeds"]  # (1, L, d), every visual token
    L = int(embeds.shape[1])
    pos = torch.arange(L, device=embeds.device).unsqueeze(0)  # (1, L): LlamaModel's default
    return Prompt(lm=lm, head=model.get_output_embeddings(), embeds=embeds, rope_positions=pos,
                  layer_positions=pos, visual_positions=encoded.state["visual_positions"].to(embeds.device),
                  next_position=L, eos=_eos(model.generation_config),
                  max_positions=int(getattr(lm.config, "max_position_embeddings", 0) or 0))


def _qwen_prompt(adapter, encoded: Encoded) -> Prompt:
    model = adapter.model
    lm = _text_model(model)
    st = encoded.state
    device = model.device
    ids = st["input_ids"].to(device)  # (1, L)
    vis = st["visual_positions"].to(device)  # (N_V,)
    embeds = model.get_input_embeddings()(ids)  # (1, L, d)
    embeds[0, vis] = encoded.visual.to(device, embeds.dtype)  # = masked_scatter of the placeholders
    deepstack = st.get("deepstack")
    if deepstack is not None:
        deepstack = [f.to(device, embeds.dtype) for f in deepstack]
    return Prompt(lm=lm, head=model.get_output_embeddings(), embeds=embeds,
                  rope_positions=st["positions"].to(device), layer_positions=None, visual_positions=vis,
                  next_position=adapter.next_position(encoded), eos=_eos(model.generation_config),
                  deepstack=deepstack,
                  max_positions=int(getattr(lm.config, "max_position_embeddings", 0) or 0))
