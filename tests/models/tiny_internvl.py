"""A tiny random InternVL checkpoint built offline, for the internvl adapter tests.

Model settings follow `InternVLVisionText2TextModelTester` in huggingface/transformers,
tests/models/internvl/test_modeling_internvl.py: InternViT width 32, 2 layers, 4 heads, FFN 128,
quick_gelu, 64 px with patch 4 (16 x 16 patches, pixel-shuffled by 0.5 to 8 x 8 = 64 tokens a tile,
`image_seq_length` 64), feature layer -1; Qwen2 width 128, 4 layers, 4 heads, 2 KV heads, FFN 37, silu,
tied embeddings. Ours: 1024 positions instead of 512 (8 video frames take 512 visual tokens), and
the tokenizer: a word-level one with InternVL's special tokens (<img>, </img>, <IMG_CONTEXT>, <video>)
named as the hub tokenizer names them (start_image_token, end_image_token, context_image_token,
video_token), and the chat template transformers' conversion script writes (an image is
"<IMG_CONTEXT>\\n", a video "<video>\\n"): `mipruner.models.internvl.random_weights.build_tokenizer`. The
image processor is transformers' GotOcr2 one (PIL) at 64 px, up to 6 tiles (the hub checkpoints allow
12 at 448 px), with ImageNet normalisation as the hub checkpoints ship it.
"""
from __future__ import annotations

import json
import os

import torch

from mipruner.models.internvl.random_weights import build_tokenizer

IMAGE_SIZE, PATCH, MAX_TILES = 64, 4, 6
SEQ = (IMAGE_SIZE // PATCH // 2) ** 2  # tokens per tile after the 0.5 pixel shuffle
TEXT = dict(hidden_size=128, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            hidden_act="silu", max_position_embeddings=1024, rope_theta=10000, tie_word_embeddings=True)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=IMAGE_SIZE,
              patch_size=PATCH, num_channels=3, hidden_act="quick_gelu", use_absolute_position_embeddings=True)
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def build(seed: int = 0):
    """(model, tokenizer, image processor) in eval mode."""
    import transformers as tf

    tok = build_tokenizer()
    text = tf.Qwen2Config(**TEXT, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg = tf.InternVLConfig(vision_config=tf.InternVLVisionConfig(**VISION), text_config=text, image_seq_length=SEQ,
                            image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), vision_feature_layer=-1,
                            downsample_ratio=0.5)
    torch.manual_seed(seed)
    model = tf.InternVLForConditionalGeneration(cfg).eval()
    ip = tf.GotOcr2ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, max_patches=MAX_TILES,
                                     image_mean=MEAN, image_std=STD, crop_to_patches=False)
    return model, tok, ip


def save_tiny(path: str, seed: int = 0, video: dict | None = None) -> str:
    """Model, tokenizer (with the chat template), image processor, processor_config.json and
    video_preprocessor_config.json (`video` overrides its settings) as a hub checkpoint lays them out."""
    model, tok, ip = build(seed)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    ip.save_pretrained(path)
    with open(os.path.join(path, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "InternVLProcessor", "image_seq_length": SEQ}, f)
    vcfg = dict(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=3, do_rescale=True, rescale_factor=1 / 255,
                do_normalize=True, image_mean=MEAN, image_std=STD, do_sample_frames=False, initial_shift=True,
                video_processor_type="InternVLVideoProcessor")
    vcfg.update(video or {})
    with open(os.path.join(path, "video_preprocessor_config.json"), "w") as f:
        json.dump(vcfg, f)
    return path
