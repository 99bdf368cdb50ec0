"""A realistic-shaped, random-weight LLaVA for benchmarks: no download, built from configs.

Default shape: the CLIP ViT-L/14-336 tower of LLaVA-1.5 (24 layers, width 1024, 336 px, patch 14
-> 576 visual tokens) and a 4-layer Llama of width 4096 (LLaVA-1.5-7B's layer shape), with a tiny
word-level tokenizer. Timings of such a model show where the time goes; its answers mean nothing.
family="llava_next": the same tower and LLM as LLaVA-NeXT (anyres over LLaVA-v1.6's grid pinpoints
336x672, 672x336, 672x672, 1008x336, 336x1008, scaled with `image_size`).
"""
from __future__ import annotations

import torch

from ..common.word_tokenizer import word_tokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
WORDS = ("what is in the image describe a red square circle on blue background how many objects are "
         "there yes no one two three left right top bottom colour color of USER ASSISTANT : ? . ,").split()


def build_tokenizer(video: bool = False):
    """A word-level fast tokenizer (with offsets) over a small vocabulary, plus <image> (and <video>)."""
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>"] + (["<video>"] if video else [])
    media = {"image_token": "<image>", **({"video_token": "<video>"} if video else {})}
    return word_tokenizer(specials, WORDS, split=specials[4:], chat_template=CHAT_TEMPLATE, unk_token="<unk>",
                          bos_token="<s>", eos_token="</s>", pad_token="<pad>", extra_special_tokens=media)

def build_random_llava(image_size: int = 336, patch: int = 14, vision_layers: int = 24, vision_width: int = 1024,
                       llm_layers: int = 4, llm_width: int = 4096, llm_ffn: int = 11008,
                       dtype: torch.dtype = torch.bfloat16, seed: int = 0, family: str = "llava",
                       device: str | torch.device = "cpu", text_init: float | None = None,
                       vocab_size: int | None = None):
    """(adapter, description) for a random-weight model of the given shape, in eval mode, built on
    `device` (LlavaAdapter; LlavaNextAdapter for family="llava_next"). text_init: the Llama's
    initializer std (None: its config default, 0.02; tiny models need more for input-dependent answers).
    vocab_size: embedding / LM head rows (None: the tokenizer's; the checkpoint's own, e.g. 32064 for
    llava-hf/llava-1.5-7b-hf, gives the real head's cost per decoded token)."""
    import transformers as tf

    from .llava_hf import LlavaAdapter
    from .llava_next import LlavaNextAdapter

    tok = build_tokenizer()
    vision = tf.CLIPVisionConfig(hidden_size=vision_width, intermediate_size=4 * vision_width,
                                 num_hidden_layers=vision_layers, num_attention_heads=vision_width // 64,
                                 image_size=image_size, patch_size=patch)
    text = tf.LlamaConfig(hidden_size=llm_width, intermediate_size=llm_ffn, num_hidden_layers=llm_layers,
                          num_attention_heads=llm_width // 128, num_key_value_heads=llm_width // 128,
                          vocab_size=vocab_size or len(tok), max_position_embeddings=4096, bos_token_id=1,
                          eos_token_id=2, pad_token_id=3, **({} if text_init is None else {"initializer_range": text_init}))
    common = dict(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                  vision_feature_layer=-2, vision_feature_select_strategy="default")
    size = dict(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    s = image_size
    pinpoints = [[s, 2 * s], [2 * s, s], [2 * s, 2 * s], [3 * s, s], [s, 3 * s]]
    if family == "llava":
        config, ip = tf.LlavaConfig(**common), tf.LlavaImageProcessorPil(**size)
        model_cls, proc_cls, cls, what = tf.LlavaForConditionalGeneration, tf.LlavaProcessor, LlavaAdapter, "LLaVA"
    elif family == "llava_next":
        config = tf.LlavaNextConfig(image_grid_pinpoints=pinpoints, **common)
        ip = tf.LlavaNextImageProcessorPil(image_grid_pinpoints=pinpoints, **size)
        model_cls, proc_cls, cls, what = (tf.LlavaNextForConditionalGeneration, tf.LlavaNextProcessor,
                                          LlavaNextAdapter, "LLaVA-NeXT")
    else:
        raise ValueError(f"family must be 'llava' or 'llava_next', got {family!r}")
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "sdpa"
    from mipruner.models.common.random_build import build_model

    torch.manual_seed(seed)
    model = build_model(model_cls, config, device=device, dtype=dtype)  # in dtype, inv_freq in fp32
    proc = proc_cls(image_processor=ip, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="default",
                    num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)
    desc = (f"random-weight {what}: CLIP {vision_layers}x{vision_width} @ {image_size}px/patch {patch}, "
            f"Llama {llm_layers}x{llm_width} (ffn {llm_ffn}), {str(dtype).replace('torch.', '')}")
    return cls(model, proc, tok, ip, name=f"random-{family}"), desc


# The family table's builders (`mipruner.models.families`). Tiny: widths as `bench gpu --tiny`, 2 Llama layers
# drawn with std 0.2 (answers that depend on the kept tokens); real: LLaVA-1.5-7B's tower, all 32 Llama-7B
# layers and its 32,064-row vocabulary (llava-hf/llava-1.5-7b-hf's config.json; the word-level tokenizer uses
# the first few rows).
LLAVA_TINY = dict(image_size=56, patch=14, vision_layers=2, vision_width=64, llm_layers=2, llm_width=128, llm_ffn=256,
                  text_init=0.2)
LLAVA_REAL = dict(llm_layers=32, vocab_size=32064)


def _build(family: str, *, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None,
           image_size: int | None = None):
    shape = dict(LLAVA_TINY if tiny else LLAVA_REAL)
    if llm_layers:
        shape["llm_layers"] = llm_layers
    if image_size:  # e.g. 336: (336 / 14)^2 = 576 visual tokens at tiny widths
        shape["image_size"] = image_size
    return build_random_llava(family=family, device=device, dtype=dtype, seed=seed, **shape)


def build_llava(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None,
                image_size: int | None = None):
    return _build("llava", tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers,
                  image_size=image_size)


def build_llava_next(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None,
                     image_size: int | None = None):
    return _build("llava_next", tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers,
                  image_size=image_size)
