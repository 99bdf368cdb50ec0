"""A tiny random LLaVA-OneVision checkpoint built offline, for the onevision adapter tests.

Text and vision settings follow `LlavaOnevisionVisionText2TextModelTester` in huggingface/transformers,
tests/models/llava_onevision/test_modeling_llava_onevision.py (Qwen2 width 32, 2 layers, 4 heads,
FFN 37, gelu, 580 positions; SigLIP width 32, 2 layers, 4 heads; "full" strategy, feature layer -1),
except the vision input: 16 px with patch 4 (a 4 x 4 grid, pooled 2 x 2 for video) instead of the
tester's 2 x 2 grid, so that tiles, unpadding, the anyres_max_9 shrink and the frame pooling have rows
and columns to move. Pinpoints go up to 4 x 4 tiles (a square image then has 16 x 16 canvas cells,
more than 9 tiles' worth: the canvas is shrunk as the 7B model shrinks large images). The
byte-level tokenizer and chat template are tiny_llava's.
"""
from __future__ import annotations

import json
import os

import torch

from . import tiny_llava

IMAGE_SIZE, PATCH = 16, 4
PINPOINTS = [[16, 16], [16, 32], [32, 16], [32, 32], [16, 48], [48, 16], [64, 64]]
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=37,
            hidden_act="gelu", max_position_embeddings=580)
VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH)


def build(seed: int = 0):
    """(model, tokenizer, image processor) in eval mode."""
    import transformers as tf

    tok = tiny_llava.build_tokenizer()
    text = tf.Qwen2Config(**TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
    cfg = tf.LlavaOnevisionConfig(vision_config=tf.SiglipVisionConfig(**VISION), text_config=text,
                                  image_grid_pinpoints=PINPOINTS, image_token_id=tok.convert_tokens_to_ids("<image>"),
                                  video_token_id=tok.convert_tokens_to_ids("<video>"), projector_hidden_act="gelu",
                                  vision_feature_select_strategy="full", vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = tf.LlavaOnevisionForConditionalGeneration(cfg).eval()
    ip = tf.LlavaOnevisionImageProcessorPil(image_grid_pinpoints=PINPOINTS,
                                            size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return model, tok, ip


def save_tiny(path: str, seed: int = 0, video: dict | None = None) -> str:
    """Model, tokenizer, image processor, processor_config.json and video_preprocessor_config.json
    (`video` overrides its settings) as a hub checkpoint lays them out."""
    model, tok, ip = build(seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    ip.save_pretrained(path)
    g = IMAGE_SIZE // PATCH
    with open(os.path.join(path, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": g * g,
                   "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9"}, f)
    vcfg = dict(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=3, do_rescale=True, rescale_factor=1 / 255,
                do_normalize=True, image_mean=ip.image_mean, image_std=ip.image_std,
                video_processor_type="LlavaOnevisionVideoProcessor", **(video or {}))
    with open(os.path.join(path, "video_preprocessor_config.json"), "w") as f:
        json.dump(vcfg, f)
    return path
