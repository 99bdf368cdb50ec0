"""The shapes-llava model's word-level vocabulary, tokenizer, chat template and processor.

Kept apart from the trainer so the evaluation and tests can rebuild prompts exactly as the shipped
processor does. Needs `tokenizers` and transformers (imported lazily by the builders).
"""
from __future__ import annotations

from .scenes import COLORS, NUMBERS, PLURALS, SHAPES

SPECIAL = ("<pad>", "<s>", "</s>", "<unk>", "<image>")
PAD, BOS, EOS, UNK, IMAGE = SPECIAL
BACKGROUND = "background"
# Words whose embeddings are the targets of the vision tower's per-patch alignment (stage 1);
# they stay frozen in stage 2, and each plural shares its singular's vector.
ALIGNED = (*COLORS, *SHAPES, BACKGROUND, *NUMBERS[1:])
WORDS = (
    "user", "assistant", ":", "?", ".", ",", "!", "'", "yes", "no", *ALIGNED, *PLURALS.values(), "zero",
    "is", "are", "there", "a", "an", "the", "what", "which", "color", "colour", "how", "many",
    "in", "of", "this", "image", "video", "picture", "clip", "shape", "shapes", "object", "objects",
    "any", "do", "you", "see", "and", "or", "it", "its", "answer", "with", "one", "word", "number",
    "count", "big", "small", "left", "right", "top", "bottom", "middle", "moving", "where",
)

# LLaVA-1.5's layout, without a system prompt: "USER: <image>\n{question} ASSISTANT: {answer}</s>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] in ('image', 'video') %}<image>\n{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %} {% else %}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def prompt_text(question: str, n_images: int = 1) -> str:
    """What CHAT_TEMPLATE renders for one user turn with `n_images` images and a generation prompt."""
    return "USER: " + "<image>\n" * n_images + question + " ASSISTANT:"


def vocabulary() -> dict[str, int]:
    words = list(dict.fromkeys(WORDS))  # keep order, drop duplicates
    return {w: i for i, w in enumerate([*SPECIAL, *words])}


def build_tokenizer():
    """A WordLevel tokenizer (lower-cased, split on whitespace and punctuation) as a fast tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                       special_tokens=[(BOS, vocab[BOS])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK,
                                   pad_token=PAD, extra_special_tokens={"image_token": IMAGE},
                                   padding_side="left", model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_processor(image_size: int, patch_size: int):
    """LlavaProcessor = CLIP image processor (PIL backend: no torchvision) + the word tokenizer."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                            crop_size={"height": image_size, "width": image_size})
    return LlavaProcessor(image_processor=image_processor, tokenizer=build_tokenizer(), patch_size=patch_size,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE, image_token=IMAGE)
