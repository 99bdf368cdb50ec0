"""A random-weight LLaVA-OneVision for benchmarks and the gpu check: no download, built from configs.

tiny=False: the shape of llava-hf/llava-onevision-qwen2-7b-ov-hf (its public config, which
transformers' `LlavaOnevisionConfig` defaults restate): SigLIP-so400m at 384 px, patch 14 (27 x 27
tokens per view), width 1152, FFN 4304, 16 heads, 26 layers (the released tower without its last
block: features are read at layer -1), anyres_max_9 over the default pinpoints (384 .. 2304 px);
Qwen2-7B: 28 layers of width 3584, FFN 18944, 28 heads, 4 KV heads, rope theta 1e6.
shape="0.5B": llava-hf/llava-onevision-qwen2-0.5b-ov-hf, the same tower with Qwen2-0.5B-Instruct (24 layers
of width 896, FFN 4864, 14 heads, 2 KV heads, tied embeddings; its 151,936 rows plus <image> and <video>
padded to a multiple of 64: 152,000), as transformers' conversion script builds it
(models/llava_onevision/convert_llava_onevision_weights_to_hf.py, `convert_llava_to_hf`).
tiny=True: the same geometry scaled down (64 px, patch 16: a 4 x 4 grid per view, the pinpoints
scaled alike), 2 SigLIP layers of width 32, 2 Qwen2 layers of width 64 drawn with std 0.2 (at 0.02 a tiny LLM
repeats one token whatever it sees).
The tokenizer is a small word-level one with <image> and <video>; answers mean nothing.
"""
from __future__ import annotations

import torch

from ..common.word_tokenizer import word_tokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}<|im_start|>user "
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n{% elif c['type'] == 'video' %}<video>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)
WORDS = ("what is in the image video describe a red square circle on blue background how many objects are "
         "there yes no one two three left right top bottom colour color of user assistant : ? . ,").split()
TEXT_SHAPES = {  # the LLM of each released size; vocab None: transformers' Qwen2 default (151,936)
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab=None),
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, tie_word_embeddings=True, vocab=152000),
}
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]


def build_tokenizer():
    """A word-level fast tokenizer (with offsets) over a small vocabulary, plus <image> and <video>."""
    return word_tokenizer(SPECIALS, WORDS, split=SPECIALS[2:], chat_template=CHAT_TEMPLATE, additional=SPECIALS[2:],
                          unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                          extra_special_tokens={"image_token": "<image>", "video_token": "<video>"})

def build(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None, shape: str = "7B"):
    """(adapter, description) of a random-weight LLaVA-OneVision on `device` in `dtype`, eval mode;
    llm_layers: the LLM's depth instead of the config's; shape: "7B" or "0.5B" (the released sizes)."""
    import transformers as tf

    from .adapter import LlavaOnevisionAdapter, _processor

    if shape not in TEXT_SHAPES:
        raise ValueError(f"shape must be one of {sorted(TEXT_SHAPES)}, got {shape!r}")
    tok = build_tokenizer()
    default = tf.LlavaOnevisionConfig()
    vocab = None
    pins = default.image_grid_pinpoints
    if tiny:
        image, patch = 64, 16
        vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, image_size=image, patch_size=patch)
        text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, initializer_range=0.2)
        pins = [[h * image // 384, w * image // 384] for h, w in pins]
    else:
        vision = default.vision_config
        image, patch = int(vision.image_size), int(vision.patch_size)
        text = dict(TEXT_SHAPES[shape])
        vocab = text.pop("vocab")
    if llm_layers:
        text = dict(text, num_hidden_layers=llm_layers)
    vocab = len(tok) if tiny else vocab or int(default.text_config.vocab_size)  # the real head's cost
    text_cfg = tf.Qwen2Config(**text, vocab_size=vocab, max_position_embeddings=32768, rope_theta=1e6,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = tf.LlavaOnevisionConfig(vision_config=vision, text_config=text_cfg, image_grid_pinpoints=pins,
                                     tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
                                     image_token_id=tok.convert_tokens_to_ids("<image>"),
                                     video_token_id=tok.convert_tokens_to_ids("<video>"))
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "sdpa"
    from mipruner.models.common.random_build import build_model

    torch.manual_seed(seed)
    model = build_model(tf.LlavaOnevisionForConditionalGeneration, config, device=device, dtype=dtype)  # in dtype, inv_freq in fp32
    ip = tf.LlavaOnevisionImageProcessorPil(image_grid_pinpoints=pins, size={"height": image, "width": image})
    g = image // patch
    proc = _processor(ip, tok, {"num_image_tokens": g * g}, config, CHAT_TEMPLATE)
    video = {"size": {"height": image, "width": image}, "image_mean": ip.image_mean, "image_std": ip.image_std}
    adapter = LlavaOnevisionAdapter(model, proc, tok, ip, name="random-llava_onevision", video_config=video)
    v, t = config.vision_config, config.text_config
    desc = (f"random-weight LLaVA-OneVision: SigLIP {v.num_hidden_layers}x{v.hidden_size} @ {image}px/patch {patch}, "
            f"Qwen2 {t.num_hidden_layers}x{t.hidden_size} (ffn {t.intermediate_size}), "
            f"{str(dtype).replace('torch.', '')}")
    return adapter, desc
