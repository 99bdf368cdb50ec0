"""Train the embedded shapes-llava model from scratch on synthetic scenes (`mipruner.shapes.scenes`).

    python -m mipruner.shapes.train --out assets/shapes-llava --seed 0 --threads 1 --precision fp32

Three stages (alignment of the projected patches with the word embeddings, question answering on the
decoder, clips), every scene and question drawn from `--seed`, so a run is reproducible for a seed and
thread count. Why each loss is there and what it measured: docs/embedded-model.md, "How it is trained".
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

from .vocab import EOS, build_processor
from .data import Pool, Tokens, build_pool, decoder_batch, draw_questions
from .evaluate import evaluate, query_recall
from .model import TrainConfig, autocast, build_model, frozen_word_ids, grid, uses_bf16
from .stage1 import lr_at, stage1


# Stage 2's question mixture: kind -> share of a batch.


# ----------------------------------------------------------------------------------------------


# Model


# ----------------------------------------------------------------------------------------------


# Data


# ----------------------------------------------------------------------------------------------


# Training


def attention_loss(attentions, targets) -> torch.Tensor:
    """Mean -log attention mass on the target keys (see the module docstring)."""
    terms = []
    for n, which, head, query, keys in targets:
        for layer in ([0] if which == "first" else range(1, len(attentions))):
            terms.append(attentions[layer][n, head, query, keys].float().sum())
    return -(torch.stack(terms) + 1e-4).log().mean()


def train_decoder(model, cfg: TrainConfig, tokens: Tokens, steps: int, lr: float, draw, log, name: str) -> None:
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
            pg["lr"] = lr_at(step, steps, lr, cfg.warmup)
        with autocast(cfg):
            out = lm(inputs_embeds=x, attention_mask=mask, position_ids=pos, output_attentions=cfg.attention_weight > 0)
            rows = torch.arange(len(items))
            at = torch.stack([last, last + 1], 1)  # positions predicting the answer and </s>
            logits = model.lm_head(out.last_hidden_state[rows[:, None], at]).float()  # (B, 2, V)
        y = torch.tensor([[vocab[q.answer], vocab[EOS]] for q in items])
        answer_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss = answer_loss
        if cfg.attention_weight > 0 and targets:
            att = attention_loss(out.attentions, targets)
            loss = loss + cfg.attention_weight * att
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

    train_decoder(model, cfg, tokens, cfg.stage2_steps, cfg.stage2_lr, draw, log, "stage2")


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

    train_decoder(model, cfg, tokens, cfg.clip_steps, cfg.clip_lr, draw, log, "stage3")


def save(model, processor, out: str, info: dict) -> None:
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


# ----------------------------------------------------------------------------------------------


# Evaluation


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="assets/shapes-llava")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage1-steps", type=int, default=TrainConfig.stage1_steps)
    ap.add_argument("--recon-weight", type=float, default=TrainConfig.recon_weight,
                    help="stage 1: weight of the pixel read-out loss (0: alignment only)")
    ap.add_argument("--align-cap", type=float, default=TrainConfig.align_cap,
                    help="stage 1: cosine to a word past which alignment stops pulling (0: no cap)")
    ap.add_argument("--spread-weight", type=float, default=TrainConfig.spread_weight,
                    help="stage 1: weight of the loss keeping an object's patches apart (0: off)")
    ap.add_argument("--spread-margin", type=float, default=TrainConfig.spread_margin,
                    help="stage 1: cosine between two patches of one object above which the spread loss pushes")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=TrainConfig.precision,
                    help="autocast of the training forward (auto: bf16 on CPUs with AVX-512, else fp32)")
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
    cfg = TrainConfig(seed=args.seed, stage1_steps=args.stage1_steps,
                      recon_weight=args.recon_weight, align_cap=args.align_cap, spread_weight=args.spread_weight,
                      spread_margin=args.spread_margin, precision=args.precision, stage2_steps=args.stage2_steps,
                      full_steps=args.full_steps, pool=args.pool, stage2_lr=args.stage2_lr,
                      attention_weight=args.attention_weight, text_layers=args.text_layers, batch=args.batch,
                      clips=args.clips, clip_steps=args.clip_steps, threads=args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    command = "python -m mipruner.shapes.train " + " ".join(sys.argv[1:] if argv is None else argv)
    processor = build_processor(cfg.image_size, cfg.patch_size)
    ckpt = os.path.join(tempfile.gettempdir(), f"shapes-llava-stage1-seed{cfg.seed}-{cfg.stage1_steps}"
                                               f"-r{cfg.recon_weight:g}-c{cfg.align_cap:g}"
                                               f"-s{cfg.spread_weight:g}-{cfg.spread_margin:g}.pt")
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
    info = {**asdict(cfg), "precision_used": "bf16" if uses_bf16(cfg) else "fp32", "command": command,
            "wall_time_1_thread": wall}
    save(model, processor, args.out, info)
    log(f"saved to {args.out} ({wall})")
    info[f"held_out_seed_{args.eval_seed}_{args.eval_scenes}_scenes"] = evaluate(args.out, args.eval_seed,
                                                                                  args.eval_scenes, log=log)
    save(model, processor, args.out, info)


if __name__ == "__main__":
    main()
