"""Held-out accuracy (per question family) and MI-Pruner query recall of a saved shapes model,
through the processor, as users call it (`python -m mipruner.shapes.train --eval DIR / --recall DIR`)."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch

from . import questions as sq
from . import scenes as sc
from .vocab import prompt_text


def evaluate(path: str, seed: int = 1234, n_scenes: int = 60, log=print) -> dict:
    """Held-out accuracy per family (presence per POPE split) through processor + generate, the
    answer prior per family and the count confusion (true -> predicted)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    items = sq.qa_items(seed, n_scenes)
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
    items = [it for it in sq.qa_items(seed, n_scenes, pope_split="random") if it.masks[0].any()]
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
