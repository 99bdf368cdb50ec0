"""The embedded shapes-llava model: its training config and architecture (a small CLIP tower and
Llama decoder in a stock LlavaForConditionalGeneration), and the per-patch tensors stage 1 trains on.
The recipe is in `mipruner.shapes.train`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import scenes as sc
from .vocab import ALIGNED, EOS, IMAGE, PAD, vocabulary


@dataclass
class TrainConfig:
    seed: int = 0
    image_size: int = 112  # 14 x 14 = 196 patches of 8 px: a LLaVA-like token grid at CPU cost
    patch_size: int = 8
    vision_hidden: int = 128
    vision_layers: int = 4  # shape and count need context across patches
    text_hidden: int = 192
    text_layers: int = 3  # enough for "find the asked shape, copy its attribute"
    heads: int = 4
    batch: int = 16  # small batches, more updates: per sample as cheap, learns faster from scratch
    stage1_steps: int = 1600  # colour/shape reach ~1.0 per patch in ~200 steps; count needs ~1500
    stage1_lr: float = 2e-3
    align_cap: float = 0.35  # stage 1: cosine to a word past which alignment stops pulling; 0 = no cap
    recon_weight: float = 0.0  # stage 1: weight of the pixel read-out loss (train.py docstring); 0 = off
    spread_weight: float = 10.0  # stage 1: weight of the same-object spread loss (train.py docstring); 0 = off
    spread_margin: float = 0.35  # stage 1: cosine between two patches of one object above which it pushes
    pool: int = 12000  # scenes whose visual tokens stage 2 computes once
    stage2_steps: int = 5000  # all of stage 2, the last full_steps of them on full sequences
    full_steps: int = 600
    stage2_lr: float = 1e-3
    keep_background: float = 0.1  # share of background patches kept before the full steps
    attention_weight: float = 0.5  # weight of the attention-supervision loss
    clips: int = 1500  # stage 3: clips (8 frames) whose visual tokens are computed once
    clip_steps: int = 1500  # stage 3 steps, alternating clip and image batches; 0: no stage 3
    clip_lr: float = 3e-4
    clip_batch: int = 8
    warmup: int = 50
    tau: float = 0.1  # alignment temperature = MI-Pruner's default tau (paper Tab. 4)
    min_cover: float = sc.PATCH_MIN_COVER  # a patch belongs to an object above this coverage
    threads: int = 1  # the shipped model used 1; on 2 shared cores, 2 threads ran ~5x slower
    precision: str = "auto"  # bf16 autocast or fp32; auto: bf16 where the CPU has AVX-512 (see `autocast`)


MIX: dict[str, float] = {
    "yes": 0.25, "no_hard": 0.1875, "no_any": 0.0625, "color": 0.25,
    **{f"count_{w}": 0.0625 for w in sc.NUMBERS[1:]},
}


def uses_bf16(cfg: TrainConfig) -> bool:
    """Whether training autocasts to bf16: "bf16", "fp32", or "auto": bf16 only on a CPU with AVX-512
    (about 4x faster than fp32 there; on an AVX2-only CPU, bf16 ran 8x slower than fp32)."""
    if cfg.precision == "auto":
        return "AVX512" in torch.backends.cpu.get_cpu_capability()
    return cfg.precision == "bf16"


def autocast(cfg: TrainConfig):
    """The training forward's autocast context (`uses_bf16`)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=uses_bf16(cfg))


def build_model(cfg: TrainConfig):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vocab = vocabulary()
    vision = CLIPVisionConfig(hidden_size=cfg.vision_hidden, intermediate_size=2 * cfg.vision_hidden,
                              num_hidden_layers=cfg.vision_layers, num_attention_heads=cfg.heads,
                              image_size=cfg.image_size, patch_size=cfg.patch_size, projection_dim=cfg.text_hidden)
    text = LlamaConfig(vocab_size=len(vocab), hidden_size=cfg.text_hidden, intermediate_size=2 * cfg.text_hidden,
                       num_hidden_layers=cfg.text_layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.heads, max_position_embeddings=4096, tie_word_embeddings=True,
                       bos_token_id=vocab["<s>"], eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=vocab[IMAGE],
                         vision_feature_layer=-1, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", tie_word_embeddings=True)
    torch.manual_seed(cfg.seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.pad_token_id = vocab[PAD]
    model.generation_config.eos_token_id = vocab[EOS]
    model.generation_config.bos_token_id = vocab["<s>"]
    with torch.no_grad():  # unit-norm word vectors; the aligned ones orthonormal so they never compete
        emb = model.get_input_embeddings().weight  # (V, d)
        emb.copy_(F.normalize(torch.randn_like(emb), dim=-1))
        ids = [vocab[w] for w in ALIGNED]
        q, _ = torch.linalg.qr(torch.randn(emb.shape[1], len(ids)))  # (d, n_aligned) orthonormal
        emb[ids] = q.T
        for shape, plural in sc.PLURALS.items():
            emb[vocab[plural]] = emb[vocab[shape]]
        pos = model.model.vision_tower.embeddings.position_embedding.weight  # (1 + g*g, D)
        pos[1:] = sincos_2d(cfg.image_size // cfg.patch_size, pos.shape[1]) * 0.5
    model.tie_weights()
    return model


def sincos_2d(g: int, dim: int) -> torch.Tensor:
    """(g*g, dim) 2-D sine/cosine position codes (MAE's), a locality prior for a ViT from scratch;
    CLIP's learned position embedding starts from them and keeps training."""
    quarter = dim // 4
    freq = 1.0 / (100.0 ** (torch.arange(quarter) / quarter))  # (dim/4,)
    yy, xx = torch.meshgrid(torch.arange(g, dtype=torch.float32), torch.arange(g, dtype=torch.float32), indexing="ij")
    ang_y = yy.reshape(-1, 1) * freq  # (g*g, dim/4)
    ang_x = xx.reshape(-1, 1) * freq
    return torch.cat([ang_y.sin(), ang_y.cos(), ang_x.sin(), ang_x.cos()], 1)


def frozen_word_ids() -> list[int]:
    vocab = vocabulary()
    return [vocab[w] for w in (*ALIGNED, *sc.PLURALS.values())]


def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """(B, N_V, d) projected visual tokens, selected as the config says (layer, CLS strategy)."""
    c = model.config
    out = model.model.get_image_features(pixel_values, vision_feature_layer=c.vision_feature_layer,
                                         vision_feature_select_strategy=c.vision_feature_select_strategy)
    return torch.stack(list(out.pooler_output))


def grid(model) -> int:
    v = model.config.vision_config
    return v.image_size // v.patch_size


def to_pixels(images: list[np.ndarray]) -> torch.Tensor:
    """(B, 3, H, W) CLIP-normalised; equals CLIPImageProcessorPil at the model's own size (tested)."""
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    x = torch.from_numpy(np.stack(images)).float() / 255  # (B, H, W, 3)
    x = (x - torch.tensor(OPENAI_CLIP_MEAN)) / torch.tensor(OPENAI_CLIP_STD)
    return x.permute(0, 3, 1, 2).contiguous()


def patch_targets(scene: sc.Scene, g: int, min_cover: float) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1's per-patch targets, from one coverage computation:
    labels (3, g*g): colour, shape, count index into the groups; -100 = no target;
    owner (g*g,): the object each patch shows (the most covering one, at least min_cover), -1: none."""
    labels = np.full((3, g * g), -100, dtype=np.int64)
    cover = np.stack([sc.patch_coverage(o.mask, g, g) for o in scene.objects])  # (n_obj, g*g)
    owner = np.where(cover.max(0) >= min_cover, cover.argmax(0), -1)
    counts = Counter(o.shape for o in scene.objects)
    empty = cover.sum(0) == 0
    labels[0, empty] = len(sc.COLORS)
    labels[1, empty] = len(sc.SHAPES)
    for p in np.nonzero(owner >= 0)[0]:
        o = scene.objects[owner[p]]
        labels[0, p] = list(sc.COLORS).index(o.color)
        labels[1, p] = sc.SHAPES.index(o.shape)
        labels[2, p] = counts[o.shape] - 1
    return labels, owner
