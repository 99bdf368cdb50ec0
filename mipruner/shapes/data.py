"""What the embedded model is trained on: seeded question draws, the pools of precomputed visual
tokens (scenes and clips) and the decoder batches built from them (`mipruner.shapes.train`)."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from . import questions as sq
from . import scenes as sc
from .model import MIX, TrainConfig, autocast, grid, image_features, to_pixels
from .vocab import EOS, IMAGE, prompt_text, vocabulary


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


def sample_qa(rng: np.random.Generator, seed: int, index: int) -> sq.QAItem:
    """One question with balanced answers (presence yes/no, counts 1-4); the model test draws its
    held-out questions this way."""
    family = sc.FAMILIES[int(rng.choice(3, p=[0.5, 0.25, 0.25]))]
    if family == "count":
        shape, cats = count_categories(rng)
        scene = sc.make_scene(seed, index, categories=cats)
        return next(it for it in sq.count_items(scene) if it.target == shape)
    n = int(rng.integers(1, 5))
    scene = sc.make_scene(seed, index, categories=_random_categories(rng, n) if rng.random() < 0.5 else None)
    if family == "color":
        items = sq.color_items(scene)
        if items:
            return items[int(rng.integers(len(items)))]
    present = sorted(scene.categories)
    if rng.random() < 0.5:
        return sq.presence_item(scene, *present[int(rng.integers(len(present)))].split(" "))
    absent = [c for c in sc.CATEGORIES if sc.category_name(*c) not in scene.categories]
    if rng.random() < 0.5:  # hard negative: shares a colour or a shape with a present object
        near = [c for c in absent if any(c[0] == o.color or c[1] == o.shape for o in scene.objects)]
        absent = near or absent
    return sq.presence_item(scene, *absent[int(rng.integers(len(absent)))])


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
            out["yes"].append(PoolQuestion(i, sq.presence_question(color, shape), "yes", color, shape))
        for color, shape in sc.CATEGORIES:
            if sc.category_name(color, shape) in s.categories:
                continue
            q = PoolQuestion(i, sq.presence_question(color, shape), "no", color, shape)
            out["no_any"].append(q)
            if any(color == o.color or shape == o.shape for o in s.objects):
                out["no_hard"].append(q)
        for it in sq.color_items(s):
            out["color"].append(PoolQuestion(i, it.question, it.answer, None, it.target))
        for it in sq.count_items(s):
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
        with autocast(cfg):
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


def draw_questions(pool: Pool, n: int, rng: np.random.Generator) -> tuple[list[PoolQuestion], list[str]]:
    """n questions mixed as MIX says (kinds the pool lacks are left out): (questions, their kinds)."""
    kinds = [k for k in MIX if pool.questions.get(k)]
    shares = np.array([MIX[k] for k in kinds])
    picks = rng.choice(len(kinds), size=n, p=shares / shares.sum())
    items = [pool.questions[kinds[k]][int(rng.integers(len(pool.questions[kinds[k]])))] for k in picks]
    return items, [kinds[k] for k in picks]
