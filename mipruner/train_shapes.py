"""Train the embedded shapes-llava model from scratch on synthetic scenes (`mipruner.scenes`).

    python -m mipruner.train_shapes --out assets/shapes-llava --seed 0

A LlavaForConditionalGeneration with a small CLIP vision tower and a small Llama decoder, trained
in two stages on a stream of seeded scenes (nothing is stored; batch b of stage s is drawn from
seed `seed`, so a run is reproducible for a seed and thread count):

1. Alignment: vision tower + projector. Every projected patch is scored against the (frozen,
   orthonormal) word embeddings of the colour, shape and count words by cosine / temperature (0.1,
   MI-Pruner's tau), and trained with cross-entropy to name its object's colour, its shape and how
   many objects of that shape the image holds ("background" for empty patches). Object and
   background patches weigh alike (objects are ~10% of the patches; a plain mean left shape near
   chance). This builds the paper's premise, a projection space aligned with the LLM's word
   embeddings, and lets stage 2 answer colour and count by copying from the asked shape's patches.
2. QA: decoder only (vision tower, projector and the aligned word embeddings frozen; plurals share
   their singular's vector), on a mixture of presence (balanced yes/no, half of the negatives
   sharing a colour or shape with a present object), colour-of-a-unique-shape and count questions
   (counts balanced 1-4), with the LM head tied to the embeddings; loss on the answer word and
   </s>. Then one warm restart of stage 2 (fresh AdamW + cosine, fresh scenes).

Both stages use AdamW + warmup/cosine and bf16 autocast (about 4x faster than fp32 on these CPUs).
`--eval DIR` measures held-out accuracy per question family of a saved model through the
processor, as users call it. Checkpoints after each stage (`<out>/../shapes-llava-ckpt`) make a
killed run resumable with `--resume`.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace

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
    stage2_steps: int = 2400
    stage2_lr: float = 1e-3
    restart_steps: int = 2000  # a warm restart of stage 2 (fresh AdamW + cosine, fresh scenes); 0: none
    warmup: int = 50
    stage2_round: int = 0  # > 0 when stage 2 runs again on a saved model (--continue-from): fresh data
    tau: float = 0.1  # alignment temperature = MI-Pruner's default tau (paper Tab. 4)
    min_cover: float = sc.PATCH_MIN_COVER  # a patch belongs to an object above this coverage
    threads: int = 1  # the shipped model used 1; on 2 shared cores, 2 threads ran ~5x slower


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


def sample_qa(rng: np.random.Generator, seed: int, index: int) -> sc.QAItem:
    """One training question; families and answers balanced (see module docstring)."""
    family = sc.FAMILIES[int(rng.choice(3, p=[0.5, 0.25, 0.25]))]  # presence learns slowest
    if family == "count":  # k objects of one shape plus up to 4 - k of other shapes
        k = int(rng.integers(1, 5))
        shape = sc.SHAPES[int(rng.integers(4))]
        colors = list(sc.COLORS)
        cats = [(colors[int(rng.integers(6))], shape) for _ in range(k)]
        others = [s for s in sc.SHAPES if s != shape]
        cats += [(colors[int(rng.integers(6))], others[int(rng.integers(3))])
                 for _ in range(int(rng.integers(0, 5 - k)))]
        order = rng.permutation(len(cats))
        scene = sc.make_scene(seed, index, categories=[cats[i] for i in order])
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


class Tokens:
    """Prompt ids exactly as the processor builds them (cached per question)."""

    def __init__(self, processor, n_visual: int):
        self.tok = processor.tokenizer
        self.n_visual = n_visual
        self.vocab = vocabulary()
        self._cache: dict[str, list[int]] = {}

    def prompt(self, question: str) -> list[int]:
        if question not in self._cache:
            text = prompt_text(question).replace(IMAGE, IMAGE * self.n_visual)
            self._cache[question] = self.tok(text)["input_ids"]
        return self._cache[question]

    def batch(self, questions: list[str], answers: list[str] | None = None):
        """Right-padded ids (B, L), attention mask, and per row the positions that predict the
        answer and </s> with their targets (answers given) or the last prompt position."""
        rows = [self.prompt(q) + ([self.vocab[a], self.vocab[EOS]] if answers else []) for q, a in
                zip(questions, answers or [None] * len(questions))]
        L = max(map(len, rows))
        ids = torch.full((len(rows), L), self.vocab[PAD])
        mask = torch.zeros((len(rows), L), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        lengths = mask.sum(1)
        return ids, mask, lengths


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


def stage2(model, cfg: TrainConfig, tokens: Tokens, log, checkpoint=None) -> None:
    """QA on the frozen, aligned visual tokens: train the decoder (embeddings partly frozen)."""
    for p in model.parameters():
        p.requires_grad_(False)
    lm = model.model.language_model
    for p in lm.parameters():
        p.requires_grad_(True)
    emb = model.get_input_embeddings().weight
    frozen = torch.zeros(emb.shape[0], 1)
    frozen[frozen_word_ids()] = 1
    emb.register_hook(lambda grad: grad * (1 - frozen))  # aligned words keep their vectors
    decay = [p for n, p in lm.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in lm.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.stage2_lr)
    rng = np.random.default_rng([cfg.seed, 2] + ([cfg.stage2_round] if cfg.stage2_round else []))
    first = 20_000_000 + 10_000_000 * cfg.stage2_round  # scene indices of this round
    t0, hist = time.time(), defaultdict(list)
    for step in range(cfg.stage2_steps):
        items = [sample_qa(rng, cfg.seed, first + step * cfg.batch + i) for i in range(cfg.batch)]
        ids, mask, lengths = tokens.batch([it.question for it in items], [it.answer for it in items])
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, cfg.stage2_steps, cfg.stage2_lr, cfg.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.model(input_ids=ids, attention_mask=mask, pixel_values=to_pixels([it.scene.image for it in items]))
            rows = torch.arange(len(items))
            pos = torch.stack([lengths - 3, lengths - 2], 1)  # positions predicting answer, </s>
            h = out.last_hidden_state[rows[:, None], pos]  # (B, 2, d)
            logits = model.lm_head(h).float()  # (B, 2, V)
        y = ids[rows[:, None], pos + 1]  # (B, 2)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        right = (logits[:, 0].argmax(-1) == y[:, 0]).tolist()
        hist["loss"].append(float(loss.detach()))
        for it, r in zip(items, right):
            hist[it.family].append(r)
        if (step + 1) % 25 == 0 or step == cfg.stage2_steps - 1:
            m = {k: np.mean(v[-200:]) for k, v in hist.items()}
            log(f"stage2 {step + 1}/{cfg.stage2_steps} loss {np.mean(hist['loss'][-25:]):.3f} "
                + " ".join(f"{f} {m.get(f, 0):.3f}" for f in sc.FAMILIES) + f" {time.time() - t0:.0f}s")
        if checkpoint is not None and (step + 1) % 200 == 0:
            checkpoint()


def save(model, processor, out: str, cfg: TrainConfig) -> None:
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    with open(os.path.join(out, "training.json"), "w") as f:
        import json

        json.dump(asdict(cfg), f, indent=1)


# ----------------------------------------------------------------------------------------------
# Evaluation


def evaluate(path: str, seed: int = 1234, n_scenes: int = 60, log=print) -> dict[str, float]:
    """Held-out accuracy per family (presence per POPE split) through processor + generate."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    items = sc.qa_items(seed, n_scenes)
    right: dict[str, list[bool]] = defaultdict(list)
    answers_by: dict[str, list[str]] = defaultdict(list)  # for the answer-prior baseline
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
    acc = {k: float(np.mean(v)) for k, v in sorted(right.items())}
    acc["presence"] = float(np.mean(sum((v for k, v in right.items() if k.startswith("presence")), [])))
    for k, v in acc.items():
        n = len(right.get(k, [])) or sum(len(x) for q, x in right.items() if q.startswith(k))
        log(f"{k:24s} {v:.3f}  (n={n})")
    for family, answers in sorted(answers_by.items()):
        top, count = Counter(answers).most_common(1)[0]
        log(f"answer prior {family:11s} {count / len(answers):.3f}  (always {top!r})")
    return acc


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
    ap.add_argument("--steps", type=int, help="shorthand: stage-2 steps (stage 1 keeps its default)")
    ap.add_argument("--stage2-lr", type=float, default=TrainConfig.stage2_lr)
    ap.add_argument("--restart-steps", type=int, default=TrainConfig.restart_steps)
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--threads", type=int, default=TrainConfig.threads)
    ap.add_argument("--resume", action="store_true", help="skip stage 1 if its checkpoint exists")
    ap.add_argument("--continue-from", metavar="DIR", help="a saved model: run stage 2 again from its weights")
    ap.add_argument("--round", type=int, default=1, help="with --continue-from: which fresh data round")
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
    cfg = TrainConfig(seed=args.seed, stage1_steps=args.stage1_steps,
                      stage2_steps=args.steps or args.stage2_steps, batch=args.batch, stage2_lr=args.stage2_lr, threads=args.threads, restart_steps=args.restart_steps,
                      stage2_round=args.round if args.continue_from else 0)

    def log(msg: str) -> None:
        print(msg, flush=True)

    processor = build_processor(cfg.image_size, cfg.patch_size)
    ckpt = os.path.join(os.path.dirname(os.path.abspath(args.out)), "shapes-llava-ckpt", "stage1.pt")
    model = build_model(cfg)
    if args.continue_from:
        from transformers import LlavaForConditionalGeneration

        saved = LlavaForConditionalGeneration.from_pretrained(args.continue_from, dtype=torch.float32)
        model.load_state_dict(saved.state_dict())
        log(f"continuing stage 2 from {args.continue_from}")
    elif args.resume and os.path.exists(ckpt):
        model.load_state_dict(torch.load(ckpt))
        log(f"resumed stage 1 from {ckpt}")
    else:
        stage1(model, cfg, log)
        os.makedirs(os.path.dirname(ckpt), exist_ok=True)
        torch.save(model.state_dict(), ckpt)
    tokens = Tokens(processor, grid(model) ** 2)
    stage2(model, cfg, tokens, log, checkpoint=lambda: save(model, processor, args.out, cfg))
    if cfg.restart_steps and not args.continue_from:
        stage2(model, replace(cfg, stage2_steps=cfg.restart_steps, stage2_round=cfg.stage2_round + 1), tokens,
               log, checkpoint=lambda: save(model, processor, args.out, cfg))
    save(model, processor, args.out, cfg)
    log(f"saved to {args.out}")
    evaluate(args.out, log=log)


if __name__ == "__main__":
    main()
