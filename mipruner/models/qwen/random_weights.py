"""Random-weight Qwen2-VL, Qwen2.5-VL and Qwen3-VL for benchmarks and the gpu check: no download.

tiny=False restates the public config.json of one hub checkpoint per family (transformers' config
classes default to larger members of each family, so the numbers are given here):
  Qwen/Qwen2-VL-2B-Instruct    ViT: 32 blocks of width 1280, 16 heads, MLP ratio 4, patch 14, 2 x 2
                               merge, temporal patch 2; LLM: 28 layers of width 1536, FFN 8960, 12
                               heads, 2 KV heads, rope theta 1e6, M-RoPE sections [16, 24, 24].
  Qwen/Qwen2.5-VL-3B-Instruct  ViT: 32 blocks of width 1280, FFN 3420, 16 heads, window 112 px, full
                               attention in blocks 7, 15, 23, 31, out width 2048; LLM: 36 layers of
                               width 2048, FFN 11008, 16 heads, 2 KV heads, rope theta 1e6, [16, 24, 24].
  Qwen/Qwen3-VL-2B-Instruct    ViT: 24 blocks of width 1024, FFN 4096, 16 heads, patch 16, 2 x 2 merge,
                               2304 position embeddings, DeepStack from blocks 5, 11, 17, out width
                               2048; LLM: 28 layers of width 2048, FFN 6144, 16 heads, 8 KV heads,
                               head dim 128, rope theta 5e6, interleaved M-RoPE [24, 20, 20].
All three: vocabulary 151,936 (the embedding and LM head sizes that decoding reads), tied
embeddings. Image processor: the checkpoints' pixel bounds (Qwen2/2.5: 3136 .. 12,845,056 pixels,
CLIP mean/std; Qwen3: patch 16, mean/std 0.5); the video processor: the official classes' defaults.
tiny=True: 2 ViT blocks of width 32, 2 LLM layers of width 64 (head dim 16), the same patch and
merge sizes, small pixel bounds (images of 4 x 4 .. 8 x 8 merged tokens), and LLM weights drawn with
std 0.2 (not 0.02: a tiny LLM at 0.02 repeats one token whatever it sees, so pruned and unpruned
answers would agree and the keep-all anchor would compare nothing).
The tokenizer is a small word-level one with Qwen's special tokens and chat template; answers mean
nothing.
"""
from __future__ import annotations

import torch

from ..common.word_tokenizer import word_tokenizer

SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ("what is in the image video describe a red square circle on blue background how many objects are "
         "there yes no one two three left right top bottom colour color of user assistant seconds "
         "0 1 2 3 4 5 6 7 8 9 : ? . , < >").split()
VOCAB = 151936  # the three checkpoints' vocabulary (embedding rows)

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
REAL = {
    "qwen2_vl": dict(
        vision=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2),
        text=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, max_position_embeddings=32768,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})),
    "qwen2_5_vl": dict(
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, max_position_embeddings=128000,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})),
    "qwen3_vl": dict(
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    deepstack_visual_indexes=[5, 11, 17]),
        text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                  rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                                   "mrope_interleaved": True})),
}
_TINY_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2)
TINY = {
    "qwen2_vl": dict(
        vision=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2),
        text=dict(_TINY_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})),
    "qwen2_5_vl": dict(  # window 56 px = 2 x 2 merged tokens; block 1 attends fully
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                    tokens_per_second=2),
        text=dict(_TINY_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})),
    "qwen3_vl": dict(
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                    deepstack_visual_indexes=[0, 1]),
        text=dict(_TINY_TEXT, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                            "mrope_section": [2, 3, 3], "mrope_interleaved": True})),
}
NAMES = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL"}


def build_tokenizer():
    """A word-level fast tokenizer (with offsets) over a small vocabulary plus Qwen's special tokens."""
    return word_tokenizer(SPECIALS, WORDS, split=SPECIALS[1:], chat_template=CHAT_TEMPLATE, additional=SPECIALS[2:],
                          unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>")

def _build(family: str, *, tiny: bool, device, dtype, seed: int, llm_layers: int | None = None):
    import transformers as tf

    from .qwen2_vl import Qwen2_5_VLAdapter, Qwen2VLAdapter
    from .qwen3_vl import Qwen3VLAdapter

    tok = build_tokenizer()
    shape = (TINY if tiny else REAL)[family]
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    text = dict(shape["text"], vocab_size=len(tok) if tiny else VOCAB, tie_word_embeddings=True,
                bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                **({"num_hidden_layers": llm_layers} if llm_layers else {}))
    cls, adapter_cls = {"qwen2_vl": (tf.Qwen2VLConfig, Qwen2VLAdapter),
                        "qwen2_5_vl": (tf.Qwen2_5_VLConfig, Qwen2_5_VLAdapter),
                        "qwen3_vl": (tf.Qwen3VLConfig, Qwen3VLAdapter)}[family]
    config = cls(vision_config=shape["vision"], text_config=text, tie_word_embeddings=True, **ids)
    config.text_config._attn_implementation = "sdpa"
    from mipruner.models.common.random_build import build_model

    torch.manual_seed(seed)
    model = build_model(tf.AutoModelForImageTextToText.from_config, config, device=device, dtype=dtype)  # in dtype, inv_freq in fp32
    v = config.vision_config
    patch, merge = int(v.patch_size), int(v.spatial_merge_size)
    unit = patch * merge  # pixels per merged token, per side
    qwen3 = family == "qwen3_vl"
    mean, std = ([0.5] * 3, [0.5] * 3) if qwen3 else (CLIP_MEAN, CLIP_STD)
    size = ({"shortest_edge": 16 * unit * unit, "longest_edge": 64 * unit * unit} if tiny
            else {"shortest_edge": 3136, "longest_edge": 12845056} if not qwen3
            else {"shortest_edge": 65536, "longest_edge": 16777216})
    ip = tf.Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=int(v.temporal_patch_size),
                                     size=size, image_mean=mean, image_std=std)
    video = {"size": {"shortest_edge": 16 * unit * unit, "longest_edge": (512 if qwen3 else 64) * unit * unit}} \
        if tiny else {}
    adapter = adapter_cls(model, tok, ip, video, name=f"random-{family}")
    t = config.text_config
    desc = (f"random-weight {NAMES[family]}: ViT {v.depth}x{v.hidden_size if family != 'qwen2_vl' else v.embed_dim} "
            f"patch {patch} merge {merge}, LLM {t.num_hidden_layers}x{t.hidden_size} (ffn {t.intermediate_size}), "
            f"{str(dtype).replace('torch.', '')}")
    return adapter, desc


def build_qwen2_vl(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
    """(adapter, description) of a random-weight Qwen2-VL (2B shape, or tiny); llm_layers: the LLM's depth."""
    return _build("qwen2_vl", tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers)


def build_qwen2_5_vl(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
    """(adapter, description) of a random-weight Qwen2.5-VL (3B shape, or tiny); llm_layers: the LLM's depth."""
    return _build("qwen2_5_vl", tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers)


def build_qwen3_vl(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
    """(adapter, description) of a random-weight Qwen3-VL (2B shape, or tiny); llm_layers: the LLM's depth."""
    return _build("qwen3_vl", tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers)
