"""Stage 1 of the embedded model's trainer (`mipruner.shapes.train`, whose docstring has the
recipe): the vision tower and projector learn to align each projected patch with the word vectors
of its colour, shape and count, with the alignment cap and the same-object spread loss."""
from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from . import scenes as sc
from .model import TrainConfig, autocast, grid, image_features, patch_targets, to_pixels
from .vocab import BACKGROUND, vocabulary


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
    g = grid(model)
    p = cfg.patch_size
    # a linear read-out of each patch's own pixels from its projected token (not saved, see docstring)
    recon = torch.nn.Linear(emb.shape[1], 3 * p * p) if cfg.recon_weight > 0 else None
    trained = params + (list(recon.parameters()) if recon is not None else [])
    opt = torch.optim.AdamW(trained, lr=cfg.stage1_lr, weight_decay=0.01)
    t0, hist = time.time(), defaultdict(list)
    for step in range(cfg.stage1_steps):
        scenes_ = [sc.make_scene(cfg.seed, 10_000_000 + step * cfg.batch + i) for i in range(cfg.batch)]
        targets_ = [patch_targets(s, g, cfg.min_cover) for s in scenes_]
        labels = torch.from_numpy(np.stack([t[0] for t in targets_]))  # (B, 3, N)
        owner = torch.from_numpy(np.stack([t[1] for t in targets_]))  # (B, N) object index, -1: none
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, cfg.stage1_steps, cfg.stage1_lr, cfg.warmup)
        with autocast(cfg):
            feats = image_features(model, to_pixels([s.image for s in scenes_]))  # (B, N, d)
        feats = feats.float()
        unit = F.normalize(feats, dim=-1)
        loss = ((feats.norm(dim=-1) + 1e-6).log() ** 2).mean()  # keep |v| near the unit word vectors
        same = (owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)
        same &= ~torch.eye(owner.shape[1], dtype=torch.bool)  # pairs of distinct patches of one object
        pair_cos = unit @ unit.transpose(1, 2)  # (B, N, N)
        hist["same"].append(float((pair_cos.detach() * same).sum() / same.sum().clamp(min=1)))
        if cfg.spread_weight > 0:  # two patches of one object: cosine at most spread_margin
            spread = ((pair_cos - cfg.spread_margin).clamp(min=0) ** 2 * same).sum() / same.sum().clamp(min=1)
            loss = loss + cfg.spread_weight * spread
        if recon is not None:
            pix = torch.from_numpy(np.stack([s.image for s in scenes_])).float() / 127.5 - 1  # (B, H, W, 3)
            pix = pix.view(len(scenes_), g, p, g, p, 3).permute(0, 1, 3, 2, 4, 5).reshape(len(scenes_), g * g, -1)
            rec = F.mse_loss(recon(unit), pix)
            loss = loss + cfg.recon_weight * rec
            hist["recon"].append(float(rec.detach()))
        for k, tgt in enumerate(targets):
            cos = unit @ tgt.T  # (B, N, n_words)
            if cfg.align_cap > 0:  # no pull past cos = cap (nor a push below -cap / 4): room for the rest
                cos = cos.clamp(-cfg.align_cap / 4, cfg.align_cap)
            logits = cos / cfg.tau
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
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        hist["loss"].append(float(loss.detach()))
        if (step + 1) % 25 == 0 or step == cfg.stage1_steps - 1:
            m = {k: np.mean(v[-25:]) for k, v in hist.items()}
            log(f"stage1 {step + 1}/{cfg.stage1_steps} loss {m['loss']:.3f} colour {m['obj0']:.3f} "
                f"shape {m['obj1']:.3f} count {m['obj2']:.3f} (all patches {m['acc0']:.3f}/{m['acc1']:.3f}) "
                f"recon {m.get('recon', 0):.3f} same-object cos {m['same']:.3f} "
                f"{time.time() - t0:.0f}s")
