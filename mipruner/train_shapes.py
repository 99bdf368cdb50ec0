"""Train the embedded shapes-llava model from scratch on synthetic scenes (`mipruner.scenes`).

    python -m mipruner.train_shapes --out assets/shapes-llava --seed 0 --threads 1

A LlavaForConditionalGeneration with a small CLIP vision tower and a small Llama decoder, trained
in three stages on seeded scenes and clips (nothing is stored; every scene and question is drawn from seed
`seed`, so a run is reproducible for a seed and thread count):

1. Alignment: vision tower + projector. Every projected patch is scored against the (frozen,
   orthonormal) word embeddings of the colour, shape and count words by cosine / temperature (0.1,
   MI-Pruner's tau), and trained with cross-entropy to name its object's colour, its shape and how
   many objects of that shape the image holds ("background" for empty patches). Object and
   background patches weigh alike (objects are ~10% of the patches; a plain mean left shape near
   chance). This builds the paper's premise, a projection space aligned with the LLM's word
   embeddings, and lets stage 2 answer colour and count by copying from the asked shape's patches.
2. QA: decoder only (vision tower, projector and the aligned word embeddings frozen; plurals share
   their singular's vector; LM head tied to the embeddings; loss on the answer word and </s>).
   - The frozen tower's visual tokens are computed once for a pool of `pool` scenes (half drawn
     as the eval draws them, half with k = 1..4 objects of one shape so counts are balanced), and
     the decoder is trained through `inputs_embeds`: the tower is no longer run every step.
   - Questions are drawn from every question the pool's scenes allow, mixed as MIX says: presence
     (yes/no balanced, 3/4 of the negatives sharing a colour or a shape with a present object),
     colour of a unique shape, and count with answers one..four balanced.
   - Attention supervision: the decoder has to learn to look up the asked object among 196
     tokens, and with the answer loss alone it did not (a plateau at presence ~0.65, colour ~0.8,
     count ~0.75 on the training stream, which answering from all objects at once explains). An
     extra loss, -log of the attention mass on the right patches, teaches the lookup directly:
     layer 0 head 0 at the question's shape word -> that shape's patches, layer 0 head 1 at a
     presence question's colour word -> that colour's patches, and head 0 of every later layer
     at the last prompt token -> the asked object's patches (the shape's for colour/count, the
     category's for presence when present; no target for an absent one). Nothing of this is in
     the saved model: it is a plain LLaVA.
   - Thinned sequences first: for the first `stage2_steps - full_steps` steps every object patch
     is kept but only `keep_background` of the background patches (original position ids), about
     50 instead of 209 tokens, ~4x cheaper a step; the last `full_steps` steps see every token,
     as inference does.
3. Clips: the same decoder training on a pool of `clips` 8-frame clips (`make_clip`), read as the
   LLaVA adapter reads a video: 8 images, one <image> each, 8 x 196 visual tokens. Steps alternate
   a thinned clip batch (attention targets: the asked object's patches in every frame) with a full
   image batch, so the image questions keep their accuracy. `--clip-steps 0` leaves it out.

The shipped model is this command's (about 28 minutes on one thread; assets/shapes-llava/
training.json holds the measured times and held-out accuracies).

All stages use AdamW + warmup/cosine and bf16 autocast (about 4x faster than fp32 on these CPUs).
`--eval DIR` measures held-out accuracy per question family of a saved model through the
processor, as users call it; `--recall DIR` measures MI-Pruner's query recall. A run writes
`training.json` next to the model: the config, the command, the wall time per stage and the
held-out accuracies measured at its end. A checkpoint after stage 1 (in the temp directory) makes
a killed run resumable with `--resume`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import scenes as sc
from .shapes_vocab import ALIGNED, BACKGROUND, EOS, IMAGE, PAD, build_processor, prompt_text, vocabulary


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


# Stage 2's question mixture: kind -> share of a batch.
MIX: dict[str, float] = {
    "yes": 0.25, "no_hard": 0.1875, "no_any": 0.0625, "color": 0.25,
    **{f"count_{w}": 0.0625 for w in sc.NUMBERS[1:]},
}


# ----------------------------------------------------------------------------------------------
# Model


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


# ----------------------------------------------------------------------------------------------
# Data


def to_pixels(images: list[np.ndarray]) -> torch.Tensor:
    """(B, 3, H, W) CLIP-normalised; equals CLIPImageProcessorPil at the model's own size (tested)."""
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    x = torch.from_numpy(np.stack(images)).float() / 255  # (B, H, W, 3)
    x = (x - torch.tensor(OPENAI_CLIP_MEAN)) / torch.tensor(OPENAI_CLIP_STD)
    return x.permute(0, 3, 1, 2).contiguous()


def patch_labels(scene: sc.Scene, g: int, min_cover: float) -> np.ndarray:
    """(3, g*g) targets per patch: colour, shape, count index into the groups; -100 = no target."""
    labels = np.full((3, g * g), -100, dtype=np.int64)
    cover = np.stack([sc.patch_coverage(o.mask, g, g) for o in scene.objects])  # (n_obj, g*g)
    counts = Counter(o.shape for o in scene.objects)
    empty = cover.sum(0) == 0
    labels[0, empty] = len(sc.COLORS)
    labels[1, empty] = len(sc.SHAPES)
    best = cover.argmax(0)
    for p in np.nonzero(cover.max(0) >= min_cover)[0]:
        o = scene.objects[best[p]]
        labels[0, p] = list(sc.COLORS).index(o.color)
        labels[1, p] = sc.SHAPES.index(o.shape)
        labels[2, p] = counts[o.shape] - 1
    return labels


def _random_categories(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    return [sc.CATEGORIES[i] for i in rng.choice(len(sc.CATEGORIES), size=n)]


def count_categories(rng: np.random.Generator) -> tuple[str, list[tuple[str, str]]]:
    """k = 1..4 objects of one shape plus up to 4 - k of other shapes, shuffled: (shape, categories)."""
    k = int(rng.integers(1, 5))
    shape = sc.SHAPES[int(rng.integers(4))]
    colors = list(sc.COLORS)
    cats = [(colors[int(rng.integers(6))], shape) for _ in range(k)]
    others = [s for s in sc.SHAPES if s != shape]
    cats += [(colors[int(rng.integers(6))], others[int(rng.integers(3))])
             for _ in range(int(rng.integers(0, 5 - k)))]
    order = rng.permutation(len(cats))
    return shape, [cats[i] for i in order]


def sample_qa(rng: np.random.Generator, seed: int, index: int) -> sc.QAItem:
    """One question with balanced answers (presence yes/no, counts 1-4); the model test draws its
    held-out questions this way."""
    family = sc.FAMILIES[int(rng.choice(3, p=[0.5, 0.25, 0.25]))]
    if family == "count":
        shape, cats = count_categories(rng)
        scene = sc.make_scene(seed, index, categories=cats)
        return next(it for it in sc.count_items(scene) if it.target == shape)
    n = int(rng.integers(1, 5))
    scene = sc.make_scene(seed, index, categories=_random_categories(rng, n) if rng.random() < 0.5 else None)
    if family == "color":
        items = sc.color_items(scene)
        if items:
            return items[int(rng.integers(len(items)))]
    present = sorted(scene.categories)
    if rng.random() < 0.5:
        return sc.presence_item(scene, *present[int(rng.integers(len(present)))].split(" "))
    absent = [c for c in sc.CATEGORIES if sc.category_name(*c) not in scene.categories]
    if rng.random() < 0.5:  # hard negative: shares a colour or a shape with a present object
        near = [c for c in absent if any(c[0] == o.color or c[1] == o.shape for o in scene.objects)]
        absent = near or absent
    return sc.presence_item(scene, *absent[int(rng.integers(len(absent)))])


@dataclass(frozen=True)
class PoolQuestion:
    """A stage-2 question about pool scene `scene`: the asked colour (presence only) and shape."""

    scene: int
    question: str
    answer: str
    color: str | None
    shape: str


def scene_pool(seed: int, n: int, first: int = 20_000_000) -> list[sc.Scene]:
    """n training scenes of data set `seed`: half as `make_scene` draws them, half with k = 1..4
    objects of one shape (`count_categories`), so count answers above one are common."""
    rng = np.random.default_rng([seed, 2])
    return [sc.make_scene(seed, first + i) if rng.random() < 0.5 else
            sc.make_scene(seed, first + i, categories=count_categories(rng)[1]) for i in range(n)]


def pool_questions(scenes: list[sc.Scene]) -> dict[str, list[PoolQuestion]]:
    """Every question the scenes allow, by MIX kind."""
    out: dict[str, list[PoolQuestion]] = defaultdict(list)
    for i, s in enumerate(scenes):
        for cat in sorted(s.categories):
            color, shape = cat.split(" ")
            out["yes"].append(PoolQuestion(i, sc.presence_question(color, shape), "yes", color, shape))
        for color, shape in sc.CATEGORIES:
            if sc.category_name(color, shape) in s.categories:
                continue
            q = PoolQuestion(i, sc.presence_question(color, shape), "no", color, shape)
            out["no_any"].append(q)
            if any(color == o.color or shape == o.shape for o in s.objects):
                out["no_hard"].append(q)
        for it in sc.color_items(s):
            out["color"].append(PoolQuestion(i, it.question, it.answer, None, it.target))
        for it in sc.count_items(s):
            out[f"count_{it.answer}"].append(PoolQuestion(i, it.question, it.answer, None, it.target))
    return dict(out)


class Tokens:
    """Prompt ids exactly as the processor builds them (cached per question)."""

    def __init__(self, processor, n_visual: int):
        self.tok = processor.tokenizer
        self.n_visual = n_visual
        self.vocab = vocabulary()
        self._cache: dict[str, list[int]] = {}

    def prompt(self, question: str, n_images: int = 1) -> list[int]:
        key = f"{n_images}:{question}"
        if key not in self._cache:
            text = prompt_text(question, n_images).replace(IMAGE, IMAGE * self.n_visual)
            self._cache[key] = self.tok(text)["input_ids"]
        return self._cache[key]


# ----------------------------------------------------------------------------------------------
# Training


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def stage1(model, cfg: TrainConfig, log) -> None:
    """Align each projected patch with the word vectors of its colour, shape and count."""
    vocab = vocabulary()
    emb = model.get_input_embeddings().weight.detach()
    groups = [[*sc.COLORS, BACKGROUND], [*sc.SHAPES, BACKGROUND], list(sc.NUMBERS[1:])]
    targets = [F.normalize(emb[[vocab[w] for w in ws]], dim=-1) for ws in groups]  # each (n_words, d)
    params = list(model.model.vision_tower.parameters()) + list(model.model.multi_modal_projector.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.stage1_lr, weight_decay=0.01)
    g = grid(model)
    t0, hist = time.time(), defaultdict(list)
    for step in range(cfg.stage1_steps):
        scenes_ = [sc.make_scene(cfg.seed, 10_000_000 + step * cfg.batch + i) for i in range(cfg.batch)]
        labels = torch.from_numpy(np.stack([patch_labels(s, g, cfg.min_cover) for s in scenes_]))  # (B, 3, N)
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, cfg.stage1_steps, cfg.stage1_lr, cfg.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            feats = image_features(model, to_pixels([s.image for s in scenes_]))  # (B, N, d)
        feats = feats.float()
        unit = F.normalize(feats, dim=-1)
        loss = ((feats.norm(dim=-1) + 1e-6).log() ** 2).mean()  # keep |v| near the unit word vectors
        for k, tgt in enumerate(targets):
            logits = unit @ tgt.T / cfg.tau  # (B, N, n_words)
            y = labels[:, k]  # (B, N)
            ok = y != -100
            obj = ok & (y != len(tgt) - 1) if k < 2 else ok
            # object and background patches weigh alike: objects are ~10% of the patches, and
            # averaging over all of them left shape near chance
            ce = F.cross_entropy(logits.flatten(0, 1), y.flatten().clamp(min=0), reduction="none").view_as(y)
            loss = loss + (ce * obj).sum() / obj.sum().clamp(min=1)
            if k < 2:
                bg = ok & ~obj
                loss = loss + (ce * bg).sum() / bg.sum().clamp(min=1)
            hist[f"acc{k}"].append(float((logits.argmax(-1)[ok] == y[ok]).float().mean()))
            hist[f"obj{k}"].append(float((logits.argmax(-1)[obj] == y[obj]).float().mean()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hist["loss"].append(float(loss.detach()))
        if (step + 1) % 25 == 0 or step == cfg.stage1_steps - 1:
            m = {k: np.mean(v[-25:]) for k, v in hist.items()}
            log(f"stage1 {step + 1}/{cfg.stage1_steps} loss {m['loss']:.3f} colour {m['obj0']:.3f} "
                f"shape {m['obj1']:.3f} count {m['obj2']:.3f} (all patches {m['acc0']:.3f}/{m['acc1']:.3f}) "
                f"{time.time() - t0:.0f}s")


@dataclass
class Pool:
    """Stage 2's training data: the frozen tower's visual tokens of every pool scene, computed once."""

    features: torch.Tensor  # (P, N, d) bf16; N = frames x N_V, frame after frame
    near: torch.Tensor  # (P, N) bool: patches any object touches (always kept)
    cover: list[np.ndarray]  # per scene (n_obj, N) bool: patches an object covers >= min_cover
    objects: list[list[tuple[str, str]]]  # per scene: each object's (colour, shape)
    questions: dict[str, list[PoolQuestion]]
    frames: int = 1  # images per sample (a clip: its frames, one <image> each)

    def patches(self, scene: int, color: str | None = None, shape: str | None = None) -> np.ndarray:
        """Indices of the patches of scene's objects matching colour and/or shape."""
        hit = [k for k, (c, s) in enumerate(self.objects[scene])
               if (color is None or c == color) and (shape is None or s == shape)]
        return np.nonzero(self.cover[scene][hit].any(0))[0] if hit else np.zeros(0, dtype=np.int64)


def clip_pool(seed: int, n: int, first: int = 40_000_000) -> list[sc.Scene]:
    """n training clips (`make_clip`, 8 frames) of data set `seed`."""
    return [sc.make_clip(seed, first + i) for i in range(n)]


@torch.no_grad()
def build_pool(model, cfg: TrainConfig, log, clips: bool = False) -> Pool:
    """The image pool (`scene_pool`, cfg.pool scenes) or the clip pool (`clip_pool`, cfg.clips);
    a clip's visual tokens are its frames' tokens one frame after the other, as the adapter
    feeds a video to LLaVA (one <image> per frame)."""
    t0 = time.time()
    scenes = clip_pool(cfg.seed, cfg.clips) if clips else scene_pool(cfg.seed, cfg.pool)
    frames = len(scenes[0].frames)
    g = grid(model)
    feats = []
    for k in range(0, len(scenes), max(1, 64 // frames)):
        images = [f for s in scenes[k:k + max(1, 64 // frames)] for f in s.frames]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            f = image_features(model, to_pixels(images)).to(torch.bfloat16)  # (n * frames, N, d)
        feats.append(f.reshape(-1, frames * f.shape[1], f.shape[2]))
    # per object: its coverage of every frame's patches, frames one after the other
    coverage = [np.stack([np.concatenate([sc.patch_coverage(o.mask, g, g) for o in track]) for track in s.tracks])
                for s in scenes]
    pool = Pool(torch.cat(feats), torch.from_numpy(np.stack([c.max(0) > 0 for c in coverage])),
                [c >= cfg.min_cover for c in coverage], [[(o.color, o.shape) for o in s.objects] for s in scenes],
                pool_questions(scenes), frames)
    log(f"pool: {len(scenes)} {'clips' if clips else 'scenes'}, {tuple(pool.features.shape)} visual tokens, "
        "questions " + ", ".join(f"{k} {len(v)}" for k, v in sorted(pool.questions.items()))
        + f", {time.time() - t0:.0f}s")
    return pool


def decoder_batch(model, tokens: Tokens, pool: Pool, items: list[PoolQuestion], keep_background: float,
                  rng: np.random.Generator):
    """Inputs for `items`: right-padded embeddings (B, L, d), mask, position ids, the index of each
    row's last prompt token, and the attention targets [(row, layers, head, query, key indices)]."""
    emb = model.get_input_embeddings()
    vocab = tokens.vocab
    rows, positions, last, targets = [], [], [], []
    for n, q in enumerate(items):
        ids = torch.tensor(tokens.prompt(q.question, pool.frames) + [vocab[q.answer], vocab[EOS]])
        first = int((ids == vocab[IMAGE]).nonzero()[0, 0])  # the frames' tokens are one block
        n_v = pool.features.shape[1]
        keep = torch.ones(n_v, dtype=torch.bool) if keep_background >= 1 else \
            pool.near[q.scene] | torch.from_numpy(rng.random(n_v) < keep_background)
        kept = keep.nonzero()[:, 0]
        rows.append(torch.cat([emb(ids[:first]), pool.features[q.scene][kept].float(), emb(ids[first + n_v:])]))
        positions.append(torch.cat([torch.arange(first), first + kept, torch.arange(first + n_v, len(ids))]))
        index = torch.full((n_v,), -1)  # each patch's place in the thinned row
        index[kept] = first + torch.arange(len(kept))
        shift = n_v - len(kept)
        last.append(len(ids) - 3 - shift)

        def keys(color=None, shape=None):
            return index[torch.from_numpy(pool.patches(q.scene, color, shape))]

        words = ids.tolist()
        at_shape = [j for j, t in enumerate(words) if t in (vocab[q.shape], vocab[sc.PLURALS[q.shape]])][0] - shift
        targets.append((n, "first", 0, at_shape, keys(shape=q.shape)))
        if q.color is not None:
            targets.append((n, "first", 1, words.index(vocab[q.color]) - shift, keys(color=q.color)))
        targets.append((n, "later", 0, last[-1], keys(q.color, q.shape)))
    L = max(len(r) for r in rows)
    x = torch.zeros(len(rows), L, rows[0].shape[1])
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    pos = torch.zeros(len(rows), L, dtype=torch.long)
    for n, (r, p) in enumerate(zip(rows, positions)):
        x[n, :len(r)] = r
        mask[n, :len(r)] = 1
        pos[n] = torch.cat([p, p[-1] + 1 + torch.arange(L - len(r))])
    return x, mask, pos, torch.tensor(last), [t for t in targets if len(t[4])]


def attention_loss(attentions, targets) -> torch.Tensor:
    """Mean -log attention mass on the target keys (see the module docstring)."""
    terms = []
    for n, which, head, query, keys in targets:
        for layer in ([0] if which == "first" else range(1, len(attentions))):
            terms.append(attentions[layer][n, head, query, keys].float().sum())
    return -(torch.stack(terms) + 1e-4).log().mean()


def draw_questions(pool: Pool, n: int, rng: np.random.Generator) -> tuple[list[PoolQuestion], list[str]]:
    """n questions mixed as MIX says (kinds the pool lacks are left out): (questions, their kinds)."""
    kinds = [k for k in MIX if pool.questions.get(k)]
    shares = np.array([MIX[k] for k in kinds])
    picks = rng.choice(len(kinds), size=n, p=shares / shares.sum())
    items = [pool.questions[kinds[k]][int(rng.integers(len(pool.questions[kinds[k]])))] for k in picks]
    return items, [kinds[k] for k in picks]


def train_decoder(model, tokens: Tokens, steps: int, lr: float, warmup: int, attention_weight: float, draw,
                  log, name: str) -> None:
    """Train the decoder (vision tower, projector and aligned word vectors frozen) for `steps` steps
    of AdamW + warmup/cosine; draw(step) -> (pool, questions, their kinds, keep_background, rng)."""
    for p in model.parameters():
        p.requires_grad_(False)
    lm = model.model.language_model
    for p in lm.parameters():
        p.requires_grad_(True)
    emb = model.get_input_embeddings().weight
    frozen = torch.zeros(emb.shape[0], 1)
    frozen[frozen_word_ids()] = 1
    hook = emb.register_hook(lambda grad: grad * (1 - frozen))  # aligned words keep their vectors
    decay = [p for n, p in lm.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in lm.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=lr)
    implementation = lm.config._attn_implementation
    lm.config._attn_implementation = "eager"  # attention probabilities for the supervision
    vocab = tokens.vocab
    t0, hist = time.time(), defaultdict(list)
    for step in range(steps):
        pool, items, kinds, keep_background, rng = draw(step)
        x, mask, pos, last, targets = decoder_batch(model, tokens, pool, items, keep_background, rng)
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, steps, lr, warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = lm(inputs_embeds=x, attention_mask=mask, position_ids=pos, output_attentions=attention_weight > 0)
            rows = torch.arange(len(items))
            at = torch.stack([last, last + 1], 1)  # positions predicting the answer and </s>
            logits = model.lm_head(out.last_hidden_state[rows[:, None], at]).float()  # (B, 2, V)
        y = torch.tensor([[vocab[q.answer], vocab[EOS]] for q in items])
        answer_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss = answer_loss
        if attention_weight > 0 and targets:
            att = attention_loss(out.attentions, targets)
            loss = loss + attention_weight * att
            hist["att"].append(float(att.detach()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        hist["loss"].append(float(answer_loss.detach()))
        prefix = "clip " if pool.frames > 1 else ""
        for kind, ok in zip(kinds, (logits[:, 0].argmax(-1) == y[:, 0]).tolist()):
            hist[prefix + kind.split("_")[0]].append(ok)
        if (step + 1) % 50 == 0 or step == steps - 1:
            m = {k: np.mean(v[-400:]) for k, v in hist.items() if k not in ("loss", "att")}
            log(f"{name} {step + 1}/{steps} keep {keep_background:g} loss {np.mean(hist['loss'][-50:]):.3f} "
                f"attention {np.mean(hist['att'][-50:] or [0]):.3f} " + " ".join(f"{k} {v:.3f}" for k, v in m.items())
                + f" {time.time() - t0:.0f}s")
    lm.config._attn_implementation = implementation
    hook.remove()


def stage2(model, cfg: TrainConfig, tokens: Tokens, pool: Pool, log) -> None:
    """QA on the image pool: thinned sequences, then the last cfg.full_steps on full ones."""
    rng = np.random.default_rng([cfg.seed, 3])

    def draw(step):
        items, kinds = draw_questions(pool, cfg.batch, rng)
        full = step >= cfg.stage2_steps - cfg.full_steps
        return pool, items, kinds, 1.0 if full else cfg.keep_background, rng

    train_decoder(model, tokens, cfg.stage2_steps, cfg.stage2_lr, cfg.warmup, cfg.attention_weight, draw, log,
                  "stage2")


def stage3(model, cfg: TrainConfig, tokens: Tokens, images: Pool, clips: Pool, log) -> None:
    """Clips: steps alternate between a thinned clip batch (cfg.clip_batch, keep_background) and a
    full image batch (cfg.batch), so the image questions keep their accuracy."""
    rng = np.random.default_rng([cfg.seed, 4])

    def draw(step):
        if step % 2 == 0:
            items, kinds = draw_questions(clips, cfg.clip_batch, rng)
            return clips, items, kinds, cfg.keep_background, rng
        items, kinds = draw_questions(images, cfg.batch, rng)
        return images, items, kinds, 1.0, rng

    train_decoder(model, tokens, cfg.clip_steps, cfg.clip_lr, cfg.warmup, cfg.attention_weight, draw, log, "stage3")


def save(model, processor, out: str, info: dict) -> None:
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# Evaluation


def evaluate(path: str, seed: int = 1234, n_scenes: int = 60, log=print) -> dict:
    """Held-out accuracy per family (presence per POPE split) through processor + generate, the
    answer prior per family and the count confusion (true -> predicted)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    items = sc.qa_items(seed, n_scenes)
    right: dict[str, list[bool]] = defaultdict(list)
    answers_by: dict[str, list[str]] = defaultdict(list)  # for the answer-prior baseline
    confusion: Counter = Counter()
    for k in range(0, len(items), 32):
        chunk = items[k:k + 32]
        texts = [prompt_text(it.question) for it in chunk]
        inputs = processor(images=[it.scene.pil()[0] for it in chunk], text=texts, return_tensors="pt",
                           padding=True)
        with torch.no_grad():
            gen = model.generate(**inputs, max_new_tokens=3, do_sample=False)
        answers = processor.batch_decode(gen[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        for it, a in zip(chunk, answers):
            right[it.family + (f"/{it.split}" if it.split else "")].append(a.strip() == it.answer)
            answers_by[it.family].append(it.answer)
            if it.family == "count":
                confusion[f"{it.answer}->{a.strip()}"] += 1
    acc = {k: float(np.mean(v)) for k, v in sorted(right.items())}
    acc["presence"] = float(np.mean(sum((v for k, v in right.items() if k.startswith("presence")), [])))
    for k, v in acc.items():
        n = len(right.get(k, [])) or sum(len(x) for q, x in right.items() if q.startswith(k))
        log(f"{k:24s} {v:.3f}  (n={n})")
    prior = {}
    for family, answers in sorted(answers_by.items()):
        top, count = Counter(answers).most_common(1)[0]
        prior[family] = round(count / len(answers), 3)
        log(f"answer prior {family:11s} {prior[family]:.3f}  (always {top!r})")
    log("count confusion (true->answer: n): " + ", ".join(f"{k}: {v}" for k, v in sorted(confusion.items())))
    return {**{k: round(v, 3) for k, v in acc.items()}, "answer_prior": prior,
            "count_confusion": dict(sorted(confusion.items()))}


def query_recall(path: str, seed: int = 1234, n_scenes: int = 60, budgets=(8, 16, 32), lams=(1.0, 0.5),
                 log=print) -> dict[str, float]:
    """Share of the asked object's patches kept, MI-Pruner vs random, through the adapter.

    The asked object's patches: token cells it covers by >= scenes.PATCH_MIN_COVER (grid from the
    encoding's geometry). Questions about absent objects have none and are skipped.
    """
    import mipruner

    adapter = mipruner.load(path, device="cpu")
    items = [it for it in sc.qa_items(seed, n_scenes, pope_split="random") if it.masks[0].any()]
    rec: dict[str, list[float]] = defaultdict(list)
    for n, it in enumerate(items):
        enc = adapter.encode(it.images[0], it.question)
        rows, cols = enc.geometry.grids[0]
        target = np.nonzero(sc.patch_coverage(it.masks[0], rows, cols) >= sc.PATCH_MIN_COVER)[0]
        if len(target) == 0:
            continue
        for k in budgets:
            for lam in lams:
                sel = mipruner.prune("mi", visual=enc.visual, text=enc.scoring_text, budget=k, lam=lam)
                rec[f"mi lam={lam:g} K={k}"].append(float(np.isin(target, sel.keep.numpy()).mean()))
            sel = mipruner.prune("random", visual=enc.visual, budget=k, seed=n)
            rec[f"random K={k}"].append(float(np.isin(target, sel.keep.numpy()).mean()))
    out = {key: float(np.mean(v)) for key, v in rec.items()}
    for key in sorted(out, key=lambda x: (int(x.split("K=")[1]), x)):
        log(f"{key:20s} {out[key]:.3f}  (n={len(rec[key])}, of {enc.n_visual} tokens)")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="assets/shapes-llava")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage1-steps", type=int, default=TrainConfig.stage1_steps)
    ap.add_argument("--stage2-steps", type=int, default=TrainConfig.stage2_steps)
    ap.add_argument("--full-steps", type=int, default=TrainConfig.full_steps,
                    help="the last stage-2 steps on full sequences")
    ap.add_argument("--pool", type=int, default=TrainConfig.pool, help="stage-2 scenes (visual tokens computed once)")
    ap.add_argument("--stage2-lr", type=float, default=TrainConfig.stage2_lr)
    ap.add_argument("--attention-weight", type=float, default=TrainConfig.attention_weight)
    ap.add_argument("--text-layers", type=int, default=TrainConfig.text_layers)
    ap.add_argument("--clips", type=int, default=TrainConfig.clips, help="stage-3 clips (visual tokens computed once)")
    ap.add_argument("--clip-steps", type=int, default=TrainConfig.clip_steps, help="stage-3 steps; 0: no clip stage")
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--threads", type=int, default=TrainConfig.threads)
    ap.add_argument("--resume", action="store_true", help="skip stage 1 if its checkpoint exists")
    ap.add_argument("--continue-from", metavar="DIR",
                    help="a model saved after stage 2 by the same command: run only stage 3 on it")
    ap.add_argument("--eval", metavar="DIR", help="only evaluate a saved model on held-out seed --eval-seed")
    ap.add_argument("--recall", metavar="DIR", help="only measure query recall of MI-Pruner vs random")
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument("--eval-scenes", type=int, default=60)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.eval or args.recall:
        if args.eval:
            evaluate(args.eval, args.eval_seed, args.eval_scenes)
        if args.recall:
            query_recall(args.recall, args.eval_seed, args.eval_scenes)
        return
    cfg = TrainConfig(seed=args.seed, stage1_steps=args.stage1_steps, stage2_steps=args.stage2_steps,
                      full_steps=args.full_steps, pool=args.pool, stage2_lr=args.stage2_lr,
                      attention_weight=args.attention_weight, text_layers=args.text_layers, batch=args.batch,
                      clips=args.clips, clip_steps=args.clip_steps, threads=args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    command = "python -m mipruner.train_shapes " + " ".join(sys.argv[1:] if argv is None else argv)
    processor = build_processor(cfg.image_size, cfg.patch_size)
    ckpt = os.path.join(tempfile.gettempdir(), f"shapes-llava-stage1-seed{cfg.seed}-{cfg.stage1_steps}.pt")
    model = build_model(cfg)
    wall: dict[str, float] = {}
    t0 = time.time()
    tokens = Tokens(processor, grid(model) ** 2)
    if args.continue_from:
        from transformers import LlavaForConditionalGeneration

        saved = LlavaForConditionalGeneration.from_pretrained(args.continue_from, dtype=torch.float32)
        model.load_state_dict(saved.state_dict())
        log(f"stages 1 and 2 from {args.continue_from}")
        previous = os.path.join(args.continue_from, "training.json")
        if os.path.exists(previous):
            with open(previous) as f:
                wall.update(json.load(f).get("wall_time_1_thread", {}))
            wall.pop("total_s", None)
    elif args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.model.vision_tower.load_state_dict(state["vision_tower"])
        model.model.multi_modal_projector.load_state_dict(state["projector"])
        log(f"resumed stage 1 from {ckpt}")
    else:
        stage1(model, cfg, log)
        torch.save({"vision_tower": model.model.vision_tower.state_dict(),
                    "projector": model.model.multi_modal_projector.state_dict()}, ckpt)
        wall["stage1_s"] = round(time.time() - t0)
    t1 = time.time()
    images = build_pool(model, cfg, log)
    wall["pool_s"] = round(time.time() - t1)
    if not args.continue_from:
        t1 = time.time()
        stage2(model, cfg, tokens, images, log)
        wall["stage2_s"] = round(time.time() - t1)
    if cfg.clip_steps:
        t1 = time.time()
        clips = build_pool(model, cfg, log, clips=True)
        wall["clip_pool_s"] = round(time.time() - t1)
        t1 = time.time()
        stage3(model, cfg, tokens, images, clips, log)
        wall["stage3_s"] = round(time.time() - t1)
    wall["total_s"] = sum(v for k, v in wall.items() if k != "total_s")
    info = {**asdict(cfg), "command": command, "wall_time_1_thread": wall}
    save(model, processor, args.out, info)
    log(f"saved to {args.out} ({wall})")
    info[f"held_out_seed_{args.eval_seed}_{args.eval_scenes}_scenes"] = evaluate(args.out, args.eval_seed,
                                                                                  args.eval_scenes, log=log)
    save(model, processor, args.out, info)


if __name__ == "__main__":
    main()
