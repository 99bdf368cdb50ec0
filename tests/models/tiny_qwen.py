"""Tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints built offline, laid out like hub checkpoints.

`build(kind, root)` writes config.json + weights, preprocessor_config.json (the PIL image processor),
video_preprocessor_config.json (what a hub checkpoint carries; its processor needs torchvision),
a byte-level BPE tokenizer trained on a few sentences with Qwen's special tokens, and a Qwen-style
chat template. Sizes are tiny (vision depth 2, width 32; text width 64, 2 layers) so a forward
pass takes milliseconds on one CPU core.
"""
from __future__ import annotations

import json
import os

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SENTENCES = [
    "What is in the image? A red square on a blue background.",
    "Describe the video. The green ball moves to the left and then to the right.",
    "How many objects are there? There are three circles and one triangle.",
    "Is the cat sleeping on the sofa? Yes, the cat is sleeping.",
    "user assistant system seconds 0 1 2 3 4 5 6 7 8 9 . < >",
]

VOCAB = 384  # >= tokenizer size; the model's embedding table


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _text_config(tok, **extra):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
               bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
               pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    cfg.update(extra)
    return cfg


def make_config(kind: str, tok):
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    if kind == "qwen2_vl":
        from transformers import Qwen2VLConfig
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        return Qwen2VLConfig(vision_config=vision, text_config=_text_config(tok), **ids)
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig
        # window 56 px = 2x2 merged tokens per window; block 1 is the full-attention one
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1], tokens_per_second=2)
        return Qwen2_5_VLConfig(vision_config=vision, text_config=_text_config(tok), **ids)
    if kind == "qwen3_vl":
        from transformers import Qwen3VLConfig
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0, 1])
        # head_dim 16 -> mrope_section sums to 8
        text = _text_config(tok, head_dim=16, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        return Qwen3VLConfig(vision_config=vision, text_config=text, **ids)
    raise ValueError(kind)


def _processor_configs(kind: str, patch: int):
    image = {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
             "do_normalize": True, "rescale_factor": 1 / 255, "resample": 3,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
             "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2,
             # small images: between 4 and 36 merged tokens (56..168 px per side at patch 14)
             "size": {"shortest_edge": (2 * patch * 2) ** 2, "longest_edge": (6 * patch * 2) ** 2}}
    video = dict(image, video_processor_type="Qwen3VLVideoProcessor" if kind == "qwen3_vl" else "Qwen2VLVideoProcessor",
                 size={"shortest_edge": (2 * patch * 2) ** 2, "longest_edge": (4 * patch * 2) ** 2},
                 fps=2.0, min_frames=4, max_frames=8, do_sample_frames=True)
    del video["image_processor_type"]
    if kind == "qwen3_vl":
        # Qwen3-VL's video budget covers all frames: t * h * w
        video["size"] = {"shortest_edge": (2 * patch * 2) ** 2, "longest_edge": 8 * (4 * patch * 2) ** 2}
    return image, video


def build(kind: str, root: str, seed: int = 0) -> str:
    """Write a tiny hub-like checkpoint of `kind` under root/kind and return its path."""
    from transformers import AutoModelForImageTextToText

    path = os.path.join(root, kind)
    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer()
    config = make_config(kind, tok)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    image, video = _processor_configs(kind, config.vision_config.patch_size)
    proc_class = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                  "qwen3_vl": "Qwen3VLProcessor"}[kind]
    image["processor_class"] = proc_class
    video["processor_class"] = proc_class
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(image, f, indent=1)
    with open(os.path.join(path, "video_preprocessor_config.json"), "w") as f:
        json.dump(video, f, indent=1)
    return path
