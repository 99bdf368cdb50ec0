"""Small random-weight LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints,
saved where vLLM loads them (the anchor tests and `python -m mipruner.bench vllm`).

Each builder returns (path, adapter): the folder vLLM loads (hub layout: config, safetensors,
tokenizer, processor) and mipruner's own adapter on the same weights (the transformers reference).
Shapes: attention heads of 32 or more (vLLM's CPU attention takes head sizes 32, 64, 80, ...), LLM
weights drawn with std 0.2 so answers depend on the kept tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LLAVA_SHAPE = dict(image_size=56, patch=14, vision_layers=2, vision_width=64, llm_layers=2, llm_width=128,
                   llm_ffn=256, text_init=0.2)  # 4 x 4 = 16 visual tokens; 1 LLM head of 128


def _rename(path: Path, old: str, new: str) -> None:
    """Rewrite the safetensors key prefix `old` as `new` (transformers 5 saves CLIP's tower without
    `vision_model.`; vLLM's loader reads the hub checkpoints' layout, which has it)."""
    for f in path.glob("*.safetensors"):
        sd = load_file(f)
        save_file({(new + k[len(old):] if k.startswith(old) else k): v.contiguous() for k, v in sd.items()}, f,
                  metadata={"format": "pt"})


def build_llava(path: Path, seed: int = 0, image_size: int | None = None):
    """image_size: the tower's input side (None: 56 px, 16 tokens; 336: LLaVA-1.5's 576 tokens)."""
    from mipruner.models.llava.random_weights import build_random_llava

    shape = dict(LLAVA_SHAPE, **({"image_size": image_size} if image_size else {}))
    adapter, _ = build_random_llava(dtype=torch.float32, seed=seed, **shape)
    adapter.model.save_pretrained(path)
    adapter.processor.save_pretrained(path)
    _rename(path, "vision_tower.", "vision_tower.vision_model.")  # the hub layout transformers saves, less vision_model.
    return path, adapter


def build_llava_next(path: Path, seed: int = 0):
    """LLaVA-NeXT at LLAVA_SHAPE: a 4 x 4 base view and anyres tiles of 56 px over the pinpoints 56x112, 112x56,
    112x112, 168x56, 56x168 (mipruner's `build_random_llava(family="llava_next")`), saved as `build_llava` saves."""
    from mipruner.models.llava.random_weights import build_random_llava

    adapter, _ = build_random_llava(dtype=torch.float32, seed=seed, family="llava_next", **LLAVA_SHAPE)
    adapter.model.save_pretrained(path)
    adapter.processor.save_pretrained(path)
    _rename(path, "vision_tower.", "vision_tower.vision_model.")
    return path, adapter


# The vision towers (heads of 32, a 2 x 2 merge to width 128) and the LLM (a Qwen2 with 4 heads of 32) of each
# Qwen family; images of 4 x 4 .. 8 x 8 merged tokens.
QWEN_VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=64, hidden_size=128, num_heads=2, mlp_ratio=2, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                       fullatt_block_indexes=[1], tokens_per_second=2),
    # patch 16 (32 px per merged token), DeepStack from both blocks; 8 x 8 learned position embeddings
    "qwen3_vl": dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                     patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                     deepstack_visual_indexes=[0, 1]),
}
# Qwen3-VL's LLM is a Qwen3 (q/k norms, head_dim given, interleaved M-RoPE); the others' a Qwen2.
QWEN3_TEXT = dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 6, 6],
                                               "mrope_interleaved": True})
DEEPSTACK_SCALE = 100.0  # the tiny Qwen3-VL's DeepStack features, scaled so that they change the greedy answers


def _build_qwen(family: str, path: Path, seed: int):
    import transformers as tf

    from mipruner.models.common.random_build import build_model
    from mipruner.models.qwen.qwen2_vl import Qwen2_5_VLAdapter, Qwen2VLAdapter
    from mipruner.models.qwen.qwen3_vl import Qwen3VLAdapter
    from mipruner.models.qwen.random_weights import CHAT_TEMPLATE, CLIP_MEAN, CLIP_STD, build_tokenizer

    config_cls, processor_cls, adapter_cls = {
        "qwen2_vl": (tf.Qwen2VLConfig, tf.Qwen2VLProcessor, Qwen2VLAdapter),
        "qwen2_5_vl": (tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLProcessor, Qwen2_5_VLAdapter),
        "qwen3_vl": (tf.Qwen3VLConfig, tf.Qwen3VLProcessor, Qwen3VLAdapter)}[family]
    tok = build_tokenizer()
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2, vocab_size=len(tok),
                tie_word_embeddings=True, bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]})
    text.update(QWEN3_TEXT if family == "qwen3_vl" else {})
    config = config_cls(vision_config=QWEN_VISION[family], text_config=text, tie_word_embeddings=True, **ids)
    config.text_config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = build_model(tf.AutoModelForImageTextToText.from_config, config, device="cpu", dtype=torch.float32)
    if family == "qwen3_vl":  # DeepStack's output layers x DEEPSTACK_SCALE: at their init its features move the
        with torch.no_grad():  # logits by 0.05 at most and no greedy token, and the anchors would not check them
            for merger in model.model.visual.deepstack_merger_list:
                merger.linear_fc2.weight.mul_(DEEPSTACK_SCALE)
                merger.linear_fc2.bias.mul_(DEEPSTACK_SCALE)
    patch = QWEN_VISION[family]["patch_size"]
    unit = 2 * patch  # pixels per merged token, per side
    size = {"shortest_edge": 16 * unit * unit, "longest_edge": 64 * unit * unit}
    mean, std = ([0.5] * 3, [0.5] * 3) if family == "qwen3_vl" else (CLIP_MEAN, CLIP_STD)  # as random_weights'
    ip = tf.Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2, size=size,
                                     image_mean=mean, image_std=std)
    video_cls = tf.Qwen3VLVideoProcessor if family == "qwen3_vl" else tf.Qwen2VLVideoProcessor
    vp = video_cls(patch_size=patch, merge_size=2, temporal_patch_size=2, size=size, image_mean=mean, image_std=std)
    proc = processor_cls(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)
    model.save_pretrained(path)
    proc.save_pretrained(path)
    adapter = adapter_cls(model, tok, ip, {"size": size}, name=f"tiny-{family}")
    return path, adapter


def build_qwen2_vl(path: Path, seed: int = 0):
    """Qwen2-VL: 16 tokens from a 112 px square image, 24 from a 112 x 168 one (32 and 48 from 4-frame videos)."""
    return _build_qwen("qwen2_vl", path, seed)


def build_qwen2_5_vl(path: Path, seed: int = 0):
    """Qwen2.5-VL (window attention, 2 tokens per second): the same token counts as `build_qwen2_vl`."""
    return _build_qwen("qwen2_5_vl", path, seed)


def build_qwen3_vl(path: Path, seed: int = 0):
    """Qwen3-VL (patch 16, DeepStack from both tower blocks, a Qwen3 LLM with 4 heads of 32): 16 tokens from a
    128 px square image, 24 from a 128 x 192 one."""
    return _build_qwen("qwen3_vl", path, seed)


def build_llava_onevision(path: Path, seed: int = 0):
    """LLaVA-OneVision at mipruner's tiny geometry (`mipruner.models.onevision.random_weights`: SigLIP of 64 px,
    patch 16, a 4 x 4 grid per view, anyres_max_9 over the pinpoints scaled alike) with a Qwen2 of 4 heads of 32
    (vLLM's CPU attention takes no head of 16); saved with transformers' own LlavaOnevisionProcessor (its video
    processor too, which vLLM calls), and mipruner's adapter on the same weights."""
    import transformers as tf

    from mipruner.models.common.random_build import build_model
    from mipruner.models.onevision.adapter import LlavaOnevisionAdapter, _processor
    from mipruner.models.onevision.random_weights import CHAT_TEMPLATE, build_tokenizer

    tok = build_tokenizer()
    image, patch = 64, 16
    pins = [[h * image // 384, w * image // 384] for h, w in tf.LlavaOnevisionConfig().image_grid_pinpoints]
    vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   image_size=image, patch_size=patch)
    text = tf.Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, initializer_range=0.2, vocab_size=len(tok),
                          max_position_embeddings=4096, rope_theta=1e6, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
    config = tf.LlavaOnevisionConfig(vision_config=vision, text_config=text, image_grid_pinpoints=pins,
                                     tie_word_embeddings=False, image_token_id=tok.convert_tokens_to_ids("<image>"),
                                     video_token_id=tok.convert_tokens_to_ids("<video>"))
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = build_model(tf.LlavaOnevisionForConditionalGeneration, config, device="cpu", dtype=torch.float32)
    ip = tf.LlavaOnevisionImageProcessorPil(image_grid_pinpoints=pins, size={"height": image, "width": image})
    video = {"size": {"height": image, "width": image}, "image_mean": ip.image_mean, "image_std": ip.image_std}
    g = image // patch
    saved = tf.LlavaOnevisionProcessor(image_processor=ip, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                                       video_processor=tf.LlavaOnevisionVideoProcessor(**video), num_image_tokens=g * g,
                                       vision_feature_select_strategy=config.vision_feature_select_strategy,
                                       vision_aspect_ratio=config.vision_aspect_ratio)
    model.save_pretrained(path)
    saved.save_pretrained(path)
    _rename(path, "vision_tower.", "vision_tower.vision_model.")  # SigLIP's tower, saved as build_llava's CLIP
    proc = _processor(ip, tok, {"num_image_tokens": g * g}, config, CHAT_TEMPLATE)
    adapter = LlavaOnevisionAdapter(model, proc, tok, ip, name="tiny-llava_onevision", video_config=video)
    return path, adapter


def architectures(path: Path) -> list[str]:
    return json.loads((Path(path) / "config.json").read_text())["architectures"]
