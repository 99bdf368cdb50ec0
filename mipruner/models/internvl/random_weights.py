"""A random-weight InternVL3 for benchmarks and the gpu check: no download, built from configs.

tiny=False: the shape of OpenGVLab/InternVL3-8B-hf (shape="8B", the default) or InternVL3-1B-hf
(shape="1B"), from their public configs: InternViT-300M (24 layers of width 1024, FFN 4096, 16 heads,
448 px, patch 14, layer norm, qkv bias; `InternVLVisionConfig`'s defaults restate it), pixel shuffle
0.5 (256 tokens a tile), tiles of 448 px up to 12 plus the thumbnail; Qwen2.5-7B (28 layers of width
3584, FFN 18944, 28 heads, 4 KV heads) or Qwen2.5-0.5B (24 x 896, FFN 4864, 14 heads, 2 KV heads,
tied embeddings), rope theta 1e6, 151,674 vocabulary rows. tiny=True: the same layout scaled down (64 px tiles, patch 8: 8 x 8
patches, 16 tokens a tile, up to 6 tiles), 2 InternViT layers of width 32, 2 Qwen2 layers of width 64.
The tokenizer is a small word-level one with InternVL's special tokens; answers mean nothing.
"""
from __future__ import annotations

import torch

from ..common.word_tokenizer import word_tokenizer

CHAT_TEMPLATE = (  # transformers' conversion script's template (an image is <IMG_CONTEXT>, as the processor reads it)
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ("what is in the image video describe a red green blue square circle ball on background how many "
         "objects are there yes no one two three four left right top bottom colour color of moves from to "
         "frame by user assistant system : ? . , 0 1 2 3 4 5 6 7 8 9").split()
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
VOCAB = 151674  # the checkpoints' embedding rows (the LM head's cost per token); the tokenizer uses the first few
TEXT_SHAPES = {
    "8B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
    "1B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, tie_word_embeddings=True),
}


def build_tokenizer():
    """A word-level fast tokenizer (lower-cased, with offsets; digits one by one, so "Frame12:" reads
    as frame 1 2 :) with InternVL's special tokens named as the hub tokenizers name them."""
    return word_tokenizer(SPECIALS, WORDS, chat_template=CHAT_TEMPLATE, additional=SPECIALS[2:], lowercase=True,
                          digits=True, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                          extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                                                "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})

def build(*, tiny: bool, device, dtype, seed: int = 0, shape: str = "8B", llm_layers: int | None = None):
    """(adapter, description) of a random-weight InternVL3 on `device` in `dtype`, eval mode;
    llm_layers: the LLM's depth instead of the config's."""
    import transformers as tf

    from .adapter import InternVLAdapter, _processor

    if shape not in TEXT_SHAPES:
        raise ValueError(f"shape must be one of {sorted(TEXT_SHAPES)}, got {shape!r}")
    tok = build_tokenizer()
    if tiny:
        image, patch, tiles = 64, 8, 6
        vision = tf.InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, image_size=image, patch_size=patch)
        text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=True)
    else:
        image, patch, tiles = 448, 14, 12
        vision = tf.InternVLVisionConfig(attention_bias=True)  # InternViT-300M-448px: the class defaults
        text = TEXT_SHAPES[shape]
    if llm_layers:
        text = dict(text, num_hidden_layers=llm_layers)
    text_cfg = tf.Qwen2Config(**text, vocab_size=len(tok) if tiny else VOCAB, max_position_embeddings=32768, rope_theta=1e6,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = tf.InternVLConfig(vision_config=vision, text_config=text_cfg, downsample_ratio=0.5,
                               image_seq_length=(image // patch // 2) ** 2, vision_feature_layer=-1,
                               image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
                               tie_word_embeddings=text["tie_word_embeddings"])
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "sdpa"
    from mipruner.models.common.random_build import build_model

    torch.manual_seed(seed)
    model = build_model(tf.InternVLForConditionalGeneration, config, device=device, dtype=dtype)  # in dtype, inv_freq in fp32
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ip = tf.GotOcr2ImageProcessorPil(size={"height": image, "width": image}, max_patches=tiles, image_mean=mean,
                                     image_std=std)
    proc = _processor(ip, tok, {"image_seq_length": config.image_seq_length}, CHAT_TEMPLATE)
    video = {"size": {"height": image, "width": image}, "image_mean": mean, "image_std": std}
    adapter = InternVLAdapter(model, proc, tok, ip, name="random-internvl", video_config=video)
    v, t = config.vision_config, config.text_config
    what = "tiny" if tiny else f"InternVL3-{shape} shape"
    desc = (f"random-weight InternVL3 ({what}): InternViT {v.num_hidden_layers}x{v.hidden_size} @ {image}px/patch "
            f"{patch}, Qwen2 {t.num_hidden_layers}x{t.hidden_size} (ffn {t.intermediate_size}), "
            f"{str(dtype).replace('torch.', '')}")
    return adapter, desc
