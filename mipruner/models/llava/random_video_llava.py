"""A random-weight Video-LLaVA for benchmarks and the gpu check: no download, built from configs.

tiny=False: the shape of LanguageBind/Video-LLaVA-7B-hf (its public config.json, whose shapes
transformers' `VideoLlavaConfig` defaults restate): a CLIP ViT-L/14 tower at 224 px (24 layers,
width 1024, FFN 4096, 16 heads: 16 x 16 patches + [CLS] per frame), features at layer -2 with the
"default" strategy, a 2-layer GELU projector, and Vicuna-7B (Llama: 32 layers of width 4096, FFN
11008, 32 heads, 4096 positions). Images give 256 tokens, a video 8 frames x 257 = 2,056.
tiny=True: the same geometry at 56 px (4 x 4 patches), 2 CLIP layers of width 64, 2 Llama layers
of width 128 drawn with std 0.2 (answers that depend on the kept tokens). The tokenizer is `random_weights`'s word-level one with <image> and <video>; answers
mean nothing.
"""
from __future__ import annotations

import torch

from .random_weights import build_tokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n{% elif c['type'] == 'video' %}"
    "<video>\n{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def build(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
    """(adapter, description) of a random-weight Video-LLaVA on `device` in `dtype`, eval mode;
    llm_layers: the LLM's depth instead of the config's."""
    import transformers as tf

    from .video_llava import VideoLlavaAdapter

    tok = build_tokenizer(video=True)
    tok.chat_template = CHAT_TEMPLATE
    default = tf.VideoLlavaConfig()
    if tiny:
        vision = tf.CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     image_size=56, patch_size=14)
        text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    initializer_range=0.2)
    else:
        vision = default.vision_config
        t = default.text_config
        text = dict(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                    num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads)
    if llm_layers:
        text = dict(text, num_hidden_layers=llm_layers)
    vocab = len(tok) if tiny else int(default.text_config.vocab_size)  # Llama's 32,000 rows: the real head's cost
    text_cfg = tf.LlamaConfig(**text, num_key_value_heads=text["num_attention_heads"], vocab_size=vocab,
                              max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = tf.VideoLlavaConfig(vision_config=vision, text_config=text_cfg, vision_feature_layer=-2,
                                 vision_feature_select_strategy="default",
                                 image_token_id=tok.convert_tokens_to_ids("<image>"),
                                 video_token_id=tok.convert_tokens_to_ids("<video>"))
    config.vision_config._attn_implementation = "eager"  # attention capture for the vision-stage methods
    config.text_config._attn_implementation = "sdpa"
    from mipruner.models.common.random_build import build_model

    torch.manual_seed(seed)
    model = build_model(tf.VideoLlavaForConditionalGeneration, config, device=device, dtype=dtype)  # in dtype, inv_freq in fp32
    side = int(config.vision_config.image_size)
    ip = tf.VideoLlavaImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    adapter = VideoLlavaAdapter(model, None, tok, ip, name="random-video_llava")
    v, t = config.vision_config, config.text_config
    desc = (f"random-weight Video-LLaVA: CLIP {v.num_hidden_layers}x{v.hidden_size} @ {side}px/patch {v.patch_size}, "
            f"Llama {t.num_hidden_layers}x{t.hidden_size} (ffn {t.intermediate_size}), "
            f"{str(dtype).replace('torch.', '')}")
    return adapter, desc
