"""Tiny LLaVA-family checkpoints built offline from configs, for the adapter tests.

Every model here is random-weight and a few hundred kilobytes: a 2-layer CLIP vision tower
(56 px, patch 14 -> a 4 x 4 token grid), a 2-layer Llama, and a byte-level BPE tokenizer trained
on a handful of sentences with a small chat template. `save_tiny(family, path)` writes a
directory that `mipruner.load(path)` (AutoConfig + AutoProcessor + the model class) reads back.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

IMAGE_SIZE = 56  # vision tower input (px)
PATCH = 14  # -> 4 x 4 patch grid
GRID = IMAGE_SIZE // PATCH
MAX_POSITIONS = 512  # the tiny LLM's context

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<image>\n"
    "{% elif c['type'] == 'video' %}<video>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %} {% else %}ASSISTANT: "
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

CORPUS = [
    "USER: What is in the image? ASSISTANT: A red square on a blue background.",
    "What colour is the square in the top left corner of the picture?",
    "Describe the video: a ball moves from the left to the right, frame by frame.",
    "Is there a cat? yes no. How many objects are there? one two three four.",
    "The quick brown fox jumps over the lazy dog near the green tree.",
]


def build_tokenizer():
    """A byte-level BPE tokenizer (fast, with offsets) with <image>/<video> special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<video>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": "<image>",
                                                                            "video_token": "<video>"})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _vision_config():
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                            image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32)


def _text_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS,
                       bos_token_id=1, eos_token_id=2, pad_token_id=3)


PINPOINTS = [[IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE], [2 * IMAGE_SIZE, 2 * IMAGE_SIZE]]


def build(family: str, *, do_pad: bool = False):
    """(model, processor) for "llava", "llava_next" or "video_llava", seeded and in eval mode."""
    import transformers as tf

    tok = build_tokenizer()
    image_id = tok.convert_tokens_to_ids("<image>")
    video_id = tok.convert_tokens_to_ids("<video>")
    vocab = len(tok)
    common = dict(vision_config=_vision_config(), text_config=_text_config(vocab),
                  vision_feature_layer=-2, vision_feature_select_strategy="default")
    ip_kwargs = dict(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    torch.manual_seed(0)
    if family == "llava":
        config = tf.LlavaConfig(image_token_id=image_id, **common)
        model = tf.LlavaForConditionalGeneration(config)
        ip = tf.LlavaImageProcessorPil(do_pad=do_pad, **ip_kwargs)
        proc = tf.LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH,
                                 vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                 chat_template=CHAT_TEMPLATE)
    elif family == "llava_next":
        config = tf.LlavaNextConfig(image_token_id=image_id, image_grid_pinpoints=PINPOINTS, **common)
        model = tf.LlavaNextForConditionalGeneration(config)
        ip = tf.LlavaNextImageProcessorPil(image_grid_pinpoints=PINPOINTS, **ip_kwargs)
        proc = tf.LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH,
                                     vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                     chat_template=CHAT_TEMPLATE)
    elif family == "video_llava":
        config = tf.VideoLlavaConfig(image_token_id=image_id, video_token_id=video_id, **common)
        model = tf.VideoLlavaForConditionalGeneration(config)
        ip = tf.VideoLlavaImageProcessor(**ip_kwargs)
        # VideoLlavaProcessor needs a torchvision video processor: ship tokenizer + image processor
        proc = SimpleNamespace(tokenizer=tok, image_processor=ip)
    else:
        raise ValueError(family)
    model.eval()
    return model, proc


def save_tiny(family: str, path: str, **kw) -> str:
    if family == "video_llava":
        return save_tiny_video_llava(path)
    model, proc = build(family, **kw)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    proc.save_pretrained(path)
    return path


def scene(width: int = IMAGE_SIZE, height: int = IMAGE_SIZE, square: tuple[int, int, int, int] | None = None,
          seed: int = 0) -> Image.Image:
    """A blue noisy background with an optional pure red square at (x0, y0, x1, y1)."""
    rng = np.random.default_rng(seed)
    arr = np.zeros((height, width, 3), dtype=np.uint8)
    arr[..., 2] = 200
    arr[..., :2] = rng.integers(0, 40, size=(height, width, 2), dtype=np.uint8)
    if square is not None:
        x0, y0, x1, y1 = square
        arr[y0:y1, x0:x1] = (255, 0, 0)
    return Image.fromarray(arr)


def save_tiny_video_llava(path: str) -> str:
    """Video-LLaVA: model + tokenizer + image processor (its combined processor needs torchvision)."""
    model, proc = build("video_llava")
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    proc.tokenizer.save_pretrained(path)
    proc.image_processor.save_pretrained(path)
    return path
