"""LLaVA-1.5 in vLLM with mipruner's pruning: vLLM's LlavaForConditionalGeneration, whose
`embed_multimodal` returns K of each image's projected tokens, chosen by `mipruner.prune`.

Positions: LLaVA's language model uses 1-D RoPE and vLLM numbers every prompt token 0..L-1 itself,
so the K kept tokens sit at consecutive positions right after the text before them, and the text
after the image moves up by N - K: mipruner's "compact" positions. (Its "original" positions, with
gaps, cannot be expressed for a 1-D RoPE model in vLLM.)
"""
from __future__ import annotations

from vllm.model_executor.models.llava import (LlavaDummyInputsBuilder, LlavaForConditionalGeneration,
                                              LlavaMultiModalProcessor, LlavaProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY

from .processing import FIELD, InfoMixin, ProcessorMixin
from .request import PruneRequest
from .select import choose


class MiPrunerLlavaProcessingInfo(InfoMixin, LlavaProcessingInfo):
    pass


class MiPrunerLlavaMultiModalProcessor(ProcessorMixin, LlavaMultiModalProcessor):
    pass


@MULTIMODAL_REGISTRY.register_processor(MiPrunerLlavaMultiModalProcessor, info=MiPrunerLlavaProcessingInfo,
                                        dummy_inputs=LlavaDummyInputsBuilder)
class MiPrunerLlavaForConditionalGeneration(LlavaForConditionalGeneration):
    def embed_multimodal(self, **kwargs):
        specs = kwargs.pop(FIELD, None)
        embeds = super().embed_multimodal(**kwargs)
        if specs is None or len(embeds) == 0:
            return embeds
        v = self.config.vision_config
        side = int(v.image_size) // int(v.patch_size)  # CLIP's square token grid
        embed_ids = self.get_language_model().embed_input_ids
        out = []
        for spec, emb in zip(specs, embeds):
            req = PruneRequest.from_tensor(spec)
            out.append(emb if req is None else choose(req, emb, embed_ids, (side, emb.shape[0] // side))[0])
        return out
