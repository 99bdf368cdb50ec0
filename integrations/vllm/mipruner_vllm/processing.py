"""The front end's side, shared by every family: this plug-in's keys kept away from the HF processor,
the checked request attached to each image (field `mipruner_spec`) and each video (`mipruner_video_spec`)
as a tensor field, and K placeholders per image or video.

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

from .request import PREFIX, PruneRequest, check_budget, parse, strip, why_not

FIELD = "mipruner_spec"
VIDEO_FIELD = "mipruner_video_spec"
FIELDS = {"image": FIELD, "video": VIDEO_FIELD}


class InfoMixin:
    """A `*ProcessingInfo` whose HF processor never sees the mipruner_* keys."""

    def get_hf_processor(self, **kwargs):
        return super().get_hf_processor(**strip(kwargs))


class ProcessorMixin:
    """A `*MultiModalProcessor` that prunes the media in `_mipruner_media`: their spec fields and K placeholders."""

    _mipruner_media: tuple[str, ...] = ("image",)
    _vllm_prunes_video = False  # the stock model prunes videos itself under --video-pruning-rate (Qwen2.5-VL's EVS)

    def _mipruner_request(self, kwargs) -> PruneRequest | None:
        """The request's mipruner fields, else (it gives none) the engine's (`LLM(mm_processor_kwargs=...)`, the
        server's `--mm-processor-kwargs`, lmms-eval's model_args): vLLM hands this processor the request's only."""
        tok = self.info.get_tokenizer()
        if not any(str(k).startswith(PREFIX) for k in kwargs):
            engine = self.info.ctx.get_mm_config().mm_processor_kwargs or {}
            kwargs = {**{k: v for k, v in engine.items() if str(k).startswith(PREFIX)}, **kwargs}
        return parse(kwargs, lambda text: tok.encode(text, add_special_tokens=False))

    def _call_hf_processor(self, hf_data, hf_kwargs):
        return super()._call_hf_processor(hf_data, strip(hf_kwargs))

    def _postprocess_hf_mm_data(self, mm_inputs, hf_processor_mm_kwargs, processed_data):
        out = super()._postprocess_hf_mm_data(mm_inputs, hf_processor_mm_kwargs, processed_data)
        req = self._mipruner_request(hf_processor_mm_kwargs)
        for medium, key in (("image", "images"), ("video", "videos")):
            items = mm_inputs.get(key)
            if not items:
                continue
            if req is not None:
                if medium not in self._mipruner_media:
                    raise ValueError(f"mipruner_method prunes {' and '.join(self._mipruner_media)} with this model; "
                                     f"this request has a {medium}, which it does not prune")
                reason = why_not(req.method, medium)
                if reason:
                    raise ValueError(reason)
                rate = self.info.ctx.get_mm_config().video_pruning_rate
                if medium == "video" and self._vllm_prunes_video and rate:
                    raise ValueError("mipruner_method on a video of an engine started with --video-pruning-rate "
                                     "(vLLM's own EVS): use one of the two (mipruner_method evs is that rule)")
            out[FIELDS[medium]] = PruneRequest.off_tensor(len(items)) if req is None else req.to_tensor(len(items))
        return out

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return dict(super()._get_mm_fields_config(hf_inputs, hf_processor_mm_kwargs),
                    **{FIELDS[m]: MultiModalFieldConfig.batched(m, keep_on_cpu=True) for m in self._mipruner_media})

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        updates = list(super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs))
        req = self._mipruner_request(hf_processor_mm_kwargs)
        if req is None:
            return updates
        for medium in self._mipruner_media:
            if isinstance(mm_items.get(medium), EmbeddingItems):
                raise ValueError(f"mipruner_method prunes media given as pixels; this request gives {medium} "
                                 f"embeddings (prune them before sending, with mipruner.prune)")
        for i, up in enumerate(updates):
            if up.modality in self._mipruner_media and isinstance(up, PromptReplacement):
                frames = _frames(out_mm_kwargs, up.modality)
                updates[i] = dataclasses.replace(up, replacement=_pruned(up.replacement, req, frames))
        return updates


def _frames(out_mm_kwargs, medium: str):
    """item -> its frames along time: a video's temporal grid (`video_grid_thw`'s t), else its frames
    (`pixel_values_videos`' first axis: LLaVA-OneVision), else 1."""

    def get(item_idx: int) -> int:
        if medium != "video":
            return 1
        item = out_mm_kwargs[medium][item_idx]
        grid, pixels = item.get("video_grid_thw"), item.get("pixel_values_videos")
        if grid is None:
            return 1 if pixels is None else int(pixels.data.shape[0])
        return int(grid.data.reshape(-1)[0])

    return get


def _pruned(replacement, req: PruneRequest, frames):
    """The medium's replacement with K of its N placeholder tokens (the scheduler and KV cache see K)."""

    def get(item_idx: int):
        full = replacement(item_idx) if callable(replacement) else replacement
        if not isinstance(full, list) or len(set(full)) != 1:
            raise ValueError("mipruner: this model's placeholders are not one repeated token; pruning them "
                             "is not supported")
        return full[:check_budget(req, len(full), frames(item_idx))]

    return get
