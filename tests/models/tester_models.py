"""Tiny checkpoints built from the model configs of transformers' own model tests, offline.

The vision and text settings below are those of the `*VisionText2TextModelTester` classes in
huggingface/transformers, tests/models/<family>/test_modeling_<family>.py (LlavaVisionText2TextModelTester,
LlavaNextVisionText2TextModelTester, VideoLlavaVisionText2TextModelTester,
LlavaOnevisionVisionText2TextModelTester, InternVLVisionText2TextModelTester, Qwen2VLVisionText2TextModelTester,
Qwen2_5_VLVisionText2TextModelTester, Qwen3VLVisionText2TextModelTester), so the adapters are checked on
geometries we did not choose (CLIP patch 2, pinpoints [[32, 32]], Qwen spatial merge 1, patch 16,
interleaved M-RoPE). What does not fit a real tokenizer is ours: vocabulary size and special-token ids
come from the byte-level tokenizers of tiny_llava.py / tiny_qwen.py (InternVL: tiny_internvl.py's word-level
one), and the image processors are sized to each tester's vision input. Weights are random (seeded).

Video settings: the Qwen2-VL checkpoint ships no video_preprocessor_config.json (like hub checkpoints
that predate video processors: transformers then reads preprocessor_config.json and every frame);
Qwen2.5-VL samples 2 frames per second (min 4, max 8); Qwen3-VL keeps its class defaults for
sampling (2 fps) with a small pixel budget.
"""
from __future__ import annotations

import json
import os

import torch

import mipruner.models

from . import tiny_internvl, tiny_llava, tiny_onevision, tiny_qwen

FAMILIES = list(mipruner.models.FAMILIES)  # the family table's rows

CLIP = dict(hidden_size=32, projection_dim=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, hidden_act="gelu")
LLAVA_VISION = {"llava": dict(CLIP, image_size=8, patch_size=2), "llava_next": dict(CLIP, image_size=16, patch_size=2),
                "video_llava": dict(CLIP, image_size=30, patch_size=2)}
LLAVA_POSITIONS = {"llava": 512, "llava_next": 580, "video_llava": 2048}

QWEN_VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_act="quick_gelu", hidden_size=32, mlp_ratio=4, num_heads=4,
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=2, in_chans=3, hidden_act="silu", intermediate_size=32, out_hidden_size=32, hidden_size=32,
                       num_heads=4, patch_size=14, spatial_merge_size=1, temporal_patch_size=2),
    "qwen3_vl": dict(depth=2, in_chans=3, hidden_act="gelu_pytorch_tanh", intermediate_size=32, out_hidden_size=32,
                     hidden_size=32, num_heads=4, patch_size=16, spatial_merge_size=1, temporal_patch_size=2,
                     num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
}
QWEN_TEXT = {
    "qwen2_vl": dict(hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}),
    "qwen2_5_vl": dict(hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}),
    "qwen3_vl": dict(head_dim=8, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 8, 8],
                                      "mrope_interleaved": True}),
}


def build(family: str, root: str) -> str:
    """Write the tester-config checkpoint of `family` under root/family; return its path."""
    path = os.path.join(root, family)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(0)
    if family == "llava_onevision":  # the tester's settings, in tiny_onevision.py
        return tiny_onevision.save_tiny(path)
    if family == "internvl":  # InternVLVisionText2TextModelTester's settings, in tiny_internvl.py
        return tiny_internvl.save_tiny(path)
    (_build_qwen if family.startswith("qwen") else _build_llava)(family, path)
    return path


def _build_llava(family: str, path: str) -> None:
    import transformers as tf

    tok = tiny_llava.build_tokenizer()
    vision = tf.CLIPVisionConfig(**LLAVA_VISION[family])
    text = tf.LlamaConfig(**LLAMA, vocab_size=len(tok), max_position_embeddings=LLAVA_POSITIONS[family],
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    side = vision.image_size
    common = dict(vision_config=vision, text_config=text, vision_feature_layer=-1,
                  vision_feature_select_strategy="default", projector_hidden_act="gelu",
                  image_token_id=tok.convert_tokens_to_ids("<image>"))
    ip = dict(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    proc = dict(tokenizer=tok, patch_size=vision.patch_size, vision_feature_select_strategy="default",
                num_additional_image_tokens=1, chat_template=tiny_llava.CHAT_TEMPLATE)
    if family == "llava":
        model = tf.LlavaForConditionalGeneration(tf.LlavaConfig(**common))
        tf.LlavaProcessor(image_processor=tf.LlavaImageProcessorPil(**ip), **proc).save_pretrained(path)
    elif family == "llava_next":
        pins = [[32, 32]]
        model = tf.LlavaNextForConditionalGeneration(tf.LlavaNextConfig(image_grid_pinpoints=pins, **common))
        tf.LlavaNextProcessor(image_processor=tf.LlavaNextImageProcessorPil(image_grid_pinpoints=pins, **ip),
                              **proc).save_pretrained(path)
    else:  # VideoLlavaProcessor needs a torchvision video processor: tokenizer + image processor only
        config = tf.VideoLlavaConfig(video_token_id=tok.convert_tokens_to_ids("<video>"), **common)
        model = tf.VideoLlavaForConditionalGeneration(config)
        tok.save_pretrained(path)
        tf.VideoLlavaImageProcessor(**ip).save_pretrained(path)
    model.eval().save_pretrained(path)


def _build_qwen(family: str, path: str) -> None:
    import transformers as tf

    tok = tiny_qwen.build_tokenizer()
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    text = dict(QWEN_TEXT[family], vocab_size=tiny_qwen.VOCAB, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    cls = {"qwen2_vl": tf.Qwen2VLConfig, "qwen2_5_vl": tf.Qwen2_5_VLConfig, "qwen3_vl": tf.Qwen3VLConfig}[family]
    config = cls(vision_config=QWEN_VISION[family], text_config=text, tie_word_embeddings=True, **ids)
    tf.AutoModelForImageTextToText.from_config(config).eval().save_pretrained(path)
    tok.save_pretrained(path)
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
        f.write(tiny_qwen.CHAT_TEMPLATE)
    v = QWEN_VISION[family]
    unit = (v["patch_size"] * v["spatial_merge_size"]) ** 2  # pixels of one merged token
    proc_class = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
    mean = [0.5] * 3 if family == "qwen3_vl" else [0.48145466, 0.4578275, 0.40821073]
    std = [0.5] * 3 if family == "qwen3_vl" else [0.26862954, 0.26130258, 0.27577711]
    common = {"patch_size": v["patch_size"], "temporal_patch_size": 2, "merge_size": v["spatial_merge_size"],
              "image_mean": mean, "image_std": std, "processor_class": proc_class[family]}
    image = dict(common, image_processor_type="Qwen2VLImageProcessor",
                 size={"shortest_edge": 4 * unit, "longest_edge": 48 * unit})  # 4..48 tokens
    _dump(path, "preprocessor_config.json", image)
    if family == "qwen2_5_vl":
        _dump(path, "video_preprocessor_config.json", dict(
            common, video_processor_type="Qwen2VLVideoProcessor", size={"shortest_edge": 4 * unit, "longest_edge": 16 * unit},
            do_sample_frames=True, fps=2.0, min_frames=4, max_frames=8))
    elif family == "qwen3_vl":  # budget over t * h * w; sampling: the class defaults (2 fps)
        _dump(path, "video_preprocessor_config.json", dict(
            common, video_processor_type="Qwen3VLVideoProcessor", size={"shortest_edge": 4 * unit, "longest_edge": 64 * unit}))


def _dump(path: str, name: str, data: dict) -> None:
    with open(os.path.join(path, name), "w") as f:
        json.dump(data, f, indent=1)
