"""The front end's side, shared by every family: this plug-in's keys kept away from the HF processor,
the checked request attached to each image as a tensor field, and K placeholders per image.

Everything a user can get wrong raises ValueError here, in the front-end processor, so vLLM rejects
that one request (HTTP 400 on the server) and the engine keeps serving; the worker then trusts it.
Subclassed from vLLM 0.32's private processor methods (`_postprocess_hf_mm_data`,
`_get_mm_fields_config`, `_get_prompt_updates`): hence the exact pin.
"""
from __future__ import annotations

import dataclasses

from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import EmbeddingItems
from vllm.multimodal.processing.processor import PromptReplacement

from .request import PruneRequest, check_budget, parse, strip

FIELD = "mipruner_spec"


class InfoMixin:
    """A `*ProcessingInfo` whose HF processor never sees the mipruner_* keys."""

    def get_hf_processor(self, **kwargs):
        return super().get_hf_processor(**strip(kwargs))


class ProcessorMixin:
    """A `*MultiModalProcessor` that prunes images: field `mipruner_spec` and K image placeholders."""

    def _mipruner_request(self, kwargs) -> PruneRequest | None:
        tok = self.info.get_tokenizer()
        return parse(kwargs, lambda text: tok.encode(text, add_special_tokens=False))

    def _call_hf_processor(self, hf_data, hf_kwargs):
        return super()._call_hf_processor(hf_data, strip(hf_kwargs))

    def _postprocess_hf_mm_data(self, mm_inputs, hf_processor_mm_kwargs, processed_data):
        out = super()._postprocess_hf_mm_data(mm_inputs, hf_processor_mm_kwargs, processed_data)
        images = mm_inputs.get("images")
        req = self._mipruner_request(hf_processor_mm_kwargs)
        if req is not None and mm_inputs.get("videos"):
            raise ValueError("mipruner_method prunes images; this request also has a video, which this plug-in "
                             "does not prune (use vLLM's video_pruning_rate for Qwen videos, or send it alone)")
        if images:
            out[FIELD] = PruneRequest.off_tensor(len(images)) if req is None else req.to_tensor(len(images))
        return out

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return dict(super()._get_mm_fields_config(hf_inputs, hf_processor_mm_kwargs),
                    **{FIELD: MultiModalFieldConfig.batched("image", keep_on_cpu=True)})

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        updates = list(super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs))
        req = self._mipruner_request(hf_processor_mm_kwargs)
        if req is None:
            return updates
        if isinstance(mm_items.get("image"), EmbeddingItems):
            raise ValueError("mipruner_method prunes images given as pixels; this request gives image embeddings "
                             "(prune them before sending, with mipruner.prune)")
        for i, up in enumerate(updates):
            if up.modality == "image" and isinstance(up, PromptReplacement):
                updates[i] = dataclasses.replace(up, replacement=_pruned(up.replacement, req))
        return updates


def _pruned(replacement, req: PruneRequest):
    """The image's replacement with K of its N placeholder tokens (the scheduler and KV cache see K)."""

    def get(item_idx: int):
        full = replacement(item_idx) if callable(replacement) else replacement
        if not isinstance(full, list) or len(set(full)) != 1:
            raise ValueError("mipruner: this model's image placeholders are not one repeated token; pruning them "
                             "is not supported")
        return full[:check_budget(req, len(full))]

    return get
