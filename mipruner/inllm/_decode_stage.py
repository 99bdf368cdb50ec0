"""A decode-time stage inside the one greedy loop (`_greedy.greedy`): the records a method sees
(`DecodeStage`, what `DecoderRun.decode` records; `DecodeStep`, one per decoding step) and the machinery
(`DecodeRun`): a forward pre-hook on layer L-1's attention (removed after the answer) reading the new
token's attention input, its attention over the visual keys recomputed from the cached keys (`_probe`),
and the key masks (a 2-D attention mask over the cache positions) of the layers from L on.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch

from ._probe import last_token_attention


def _window(config, i: int) -> int | None:
    """Layer i's sliding window (None for full attention), as `_decoder.layer_kind` decides."""
    types = getattr(config, "layer_types", None)
    sliding = types[i] == "sliding_attention" if types else getattr(config, "sliding_window", None) is not None
    return getattr(config, "sliding_window", None) if sliding else None


@dataclass(frozen=True)
class DecodeStage:
    """A method's decode-time stage (`DecoderRun.decode`): from decoder layer `layer` on, each decoding
    step attends to the visual tokens `fn(step)` names (a `DecodeStep` in, an (N_V,) bool mask or None
    out); recorded on the Selection as `extras["decode"]` and run by the answer's one greedy loop."""

    layer: int
    fn: Callable


class DecodeStep:
    """One decoding step as a decode-time stage sees it (built by the greedy loop, one per step).

    index: 1 for the step that feeds the first generated token, 2 for the next, ...; present (N_V,)
    bool: the visual tokens in the KV cache at layer `layer`-1 (those earlier stages kept); memory: a
    dict the stage keeps across the steps of one answer (e.g. the previous step's attention).
    """

    def __init__(self, index: int, present: torch.Tensor, attention: Callable[[], torch.Tensor], memory: dict):
        self.index, self.present, self.memory = index, present, memory
        self._attention, self._memo = attention, None

    def attention(self) -> torch.Tensor:
        """(N_V,) float32 head-mean attention probabilities of the new token at layer `layer`-1 over the
        visual keys (the softmax over every key it attends to, as FastV's row; 0 for visual tokens not
        present). Computed when asked for, from the layer's attention input (a forward pre-hook removed
        after the answer) and the keys it cached; no other attention is computed."""
        if self._memo is None:
            self._memo = self._attention()
        return self._memo



def _group_rows(prompt, stages, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, which) of the prompt rows a layer's KV cache holds: `rows` (R,) sequence positions (the
    last stage at or below `layer`, else all), `which` (R,) the original visual index of each row, N_V
    for text and merged rows (always attended)."""
    vis, dev = prompt.visual_positions, prompt.embeds.device
    n = int(vis.numel())
    st = [s for s in stages if s.layer <= layer]
    rows = st[-1].rows.to(dev) if st else torch.arange(prompt.length, device=dev)
    lookup = torch.full((prompt.length,), n, dtype=torch.long, device=dev)
    lookup[vis.to(dev)] = torch.arange(n, device=dev)
    if st and st[-1].merge_rows is not None:
        lookup[st[-1].merge_rows.to(dev)] = n
    return rows, lookup.index_select(0, rows)


class DecodeRun:
    """A decode-time stage (`api.DecodeStage`) inside the greedy loop: the pre-hook reading layer L-1's
    attention input of the new token, the cache columns of the visual tokens, the key masks of the
    layer groups from L on, and the per-step count of visual keys attended (`attended`)."""

    def __init__(self, prompt, stages, decode):
        self.prompt, self.decode, self.layer = prompt, decode, int(decode.layer)
        self.n = int(prompt.visual_positions.numel())
        dev = prompt.embeds.device
        rows, which = _group_rows(prompt, stages, self.layer - 1)
        self.present = torch.zeros(self.n + 1, dtype=torch.bool, device=dev).scatter_(0, which, True)[:self.n]
        self.col = torch.zeros(self.n + 1, dtype=torch.long, device=dev).scatter_(
            0, which, torch.arange(rows.numel(), device=dev))[:self.n]  # cache column of each visual token present
        self.which = {}  # layer group start -> `which` of its cache rows
        self.memory: dict = {}
        self.attended: list[torch.Tensor] = []
        self.seen: dict = {}
        self.keep_ext = None
        self.handle = None

    def open(self):
        attn = self.prompt.lm.layers[self.layer - 1].self_attn
        me, seen = threading.get_ident(), self.seen

        def pre_hook(_module, args, kwargs):
            if threading.get_ident() != me:  # another request running the same model meanwhile
                return
            seen["x"] = args[0] if args else kwargs["hidden_states"]
            seen["cos_sin"] = kwargs["position_embeddings"]

        self.handle = attn.register_forward_pre_hook(pre_hook, with_kwargs=True)

    def close(self):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _attention(self, cache) -> torch.Tensor:
        attn = self.prompt.lm.layers[self.layer - 1].self_attn
        keys = cache.layers[self.layer - 1].keys
        row = last_token_attention(attn, self.seen["x"], self.seen["cos_sin"], keys,
                                   _window(self.prompt.lm.config, self.layer - 1))
        return row.index_select(0, self.col) * self.present

    def choose(self, index: int, cache) -> None:
        """Run the stage's function for step `index`; its mask is applied from layer L on."""
        step = DecodeStep(index, self.present, lambda: self._attention(cache), self.memory)
        keep = self.decode.fn(step)
        keep = self.present if keep is None else torch.as_tensor(keep, device=self.present.device).to(torch.bool)
        if keep.shape != self.present.shape:
            raise ValueError(f"a decode-time stage returns an ({self.n},) bool mask of the visual tokens, "
                             f"got shape {tuple(keep.shape)}")
        keep = keep & self.present
        self.attended.append(keep.sum())
        self.keep_ext = torch.cat([keep, keep.new_ones(1)])

    def key_mask(self, prompt, stages, group: range, generated: int) -> torch.Tensor | None:
        """(kv_len,) bool cache positions group `group` attends to this step, None below layer L."""
        if group.start < self.layer:
            return None
        if group.start not in self.which:
            self.which[group.start] = _group_rows(prompt, stages, group.start)[1]
        which = self.which[group.start]
        return torch.cat([self.keep_ext.index_select(0, which), self.keep_ext.new_ones(generated)])


__all__ = ["DecodeRun", "DecodeStage", "DecodeStep"]
