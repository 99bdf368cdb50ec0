"""LLaVA-NeXT in vLLM with mipruner's pruning: vLLM's LlavaNextForConditionalGeneration
(vllm-project/vllm, vllm/model_executor/models/llava_next.py), whose `embed_multimodal` returns K of each
image's N tokens, chosen by `mipruner.prune`.

The N tokens of one image are what vLLM's `_process_image_input` returns for it (its `_merge_image_patch_embeddings`,
strategy "spatial_unpad"): the base view's g x g grid, then the unpadded tile canvas row by row, each row
followed by one `image_newline` token. mipruner's own adapter (`mipruner.models.llava.llava_next`) encodes the
same N tokens in the same order, and `mipruner.select` treats the row newlines as visual tokens like any
other: they count in N and in K, and a method keeps one only if it selects it (none is kept by rule). The
plug-in does the same, so K placeholders per image are all the scheduler and the KV cache see: vLLM's
`LlavaNextProcessingInfo.get_num_image_tokens` gives N before scheduling, the front end (`processing.py`)
writes K of them. `pool` gets the grid mipruner's geometry gives (`TokenGeometry.grid`): view 0 the base
view, view 1 the unpadded canvas, the newlines view -1 (`anyres_grid`).

Positions: LLaVA-NeXT's language model (Llama, Mistral, Vicuna) uses 1-D RoPE, as LLaVA-1.5's, and vLLM numbers
every prompt token 0..L-1 itself, so the K kept tokens sit at consecutive positions and the text after the
image moves up by N - K: mipruner's "compact" positions (`mipruner.answer(..., positions="compact")`); the
"original" positions, with gaps, cannot be expressed there (as `llava.py` says for LLaVA-1.5).
"""
from __future__ import annotations

import torch
from vllm.model_executor.models.llava import LlavaDummyInputsBuilder
from vllm.model_executor.models.llava_next import (LlavaNextForConditionalGeneration, LlavaNextMultiModalProcessor,
                                                   LlavaNextProcessingInfo, get_anyres_image_grid_shape, unpad_image)
from vllm.multimodal import MULTIMODAL_REGISTRY

from .processing import FIELD, InfoMixin, ProcessorMixin
from .request import PruneRequest
from .select import choose, grid_rows, image_frames


def canvas_grid(g: int, rows: int, cols: int, device=None) -> torch.Tensor:
    """(g*g + rows*(cols+1), 3) int64 (view, row, col) of an anyres image's tokens in LLM order: the base view
    (view 0, g x g row-major), then the unpadded canvas (view 1, rows x cols), each row followed by its newline
    (view -1, row k, col `cols`), as `mipruner.models.llava.llava_next`'s geometry numbers them."""
    base = grid_rows(g, g, device)  # one frame's (0, row, col): view 0
    cr = torch.arange(rows, device=device).repeat_interleave(cols + 1)
    cc = torch.arange(cols + 1, device=device).repeat(rows)
    view = torch.where(cc == cols, -1, 1)
    return torch.cat([base, torch.stack([view, cr, cc], 1)])


def anyres_grid(config, image_size, n: int, device=None) -> torch.Tensor:
    """The grid of one image of (height, width) `image_size` whose merged embedding has n rows: the canvas's
    unpadded extent from transformers' `get_anyres_image_grid_shape` and `unpad_image`, the functions vLLM's
    `LlavaNextForConditionalGeneration._merge_image_patch_embeddings` calls (on an index-free zero canvas here)."""
    h, w = (int(x) for x in torch.as_tensor(image_size).reshape(-1).tolist())
    v = config.vision_config
    g = int(v.image_size) // int(v.patch_size)
    tiles_h, tiles_w = get_anyres_image_grid_shape((h, w), config.image_grid_pinpoints, int(v.image_size))
    rows, cols = unpad_image(torch.zeros(1, tiles_h * g, tiles_w * g), (h, w)).shape[1:]
    grid = canvas_grid(g, int(rows), int(cols), device)
    if grid.shape[0] != n:  # e.g. a single-view image (base + one newline): not this layout
        raise RuntimeError(f"mipruner: a LLaVA-NeXT image of {n} tokens is not a {g}x{g} base view and a "
                           f"{rows}x{cols} canvas with row newlines ({grid.shape[0]} tokens)")
    return grid


class MiPrunerLlavaNextProcessingInfo(InfoMixin, LlavaNextProcessingInfo):
    pass


class MiPrunerLlavaNextMultiModalProcessor(ProcessorMixin, LlavaNextMultiModalProcessor):
    pass


@MULTIMODAL_REGISTRY.register_processor(MiPrunerLlavaNextMultiModalProcessor, info=MiPrunerLlavaNextProcessingInfo,
                                        dummy_inputs=LlavaDummyInputsBuilder)
class MiPrunerLlavaNextForConditionalGeneration(LlavaNextForConditionalGeneration):
    def embed_multimodal(self, **kwargs):
        specs = kwargs.pop(FIELD, None)
        sizes = kwargs.get("image_sizes")
        embeds = super().embed_multimodal(**kwargs)
        if specs is None or len(embeds) == 0:
            return embeds
        embed_ids = self.get_language_model().embed_input_ids
        out = []
        for i, (spec, emb) in enumerate(zip(specs, embeds)):
            req = PruneRequest.from_tensor(spec)
            if req is None:
                out.append(emb)
                continue
            grid = anyres_grid(self.config, sizes[i], emb.shape[0], emb.device)
            out.append(choose(req, emb, embed_ids, grid=grid, frame_index=image_frames(grid))[0])
        return out
