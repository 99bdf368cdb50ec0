"""Run pruners x budgets over evaluation items with one encoding per item; aggregate rows.

Per item: encode once, select for every method and budget on the cached encoding (the selections of a
group of encodings as one batched call where the method allows it, `mipruner.select_batch`), then answer
unpruned (method "none") and on every selection's kept tokens, all answers of the item as one
batch (`mipruner.answer_batch`). Random is run with 3 seeds and averaged,
as in the paper. Every method goes through `mipruner.select` / `mipruner.answer` with one cache
per item, so MI's normalisers and the in-LLM methods' first K layers are computed once per item
and shared by every budget. Items are encoded `encode_batch` at a time (`mipruner.serve.batch.encode_items`:
one vision-tower call per group where the family batches its tower, else one by one).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable


import mipruner
from mipruner.serve.batch import answer_batch_guarded
from mipruner.serve.failures import guarded
from mipruner.pruners import get_pruner
from mipruner.pruners.selection import withdrawn_at

from .metrics import average_splits, open_metrics, pope_metrics, query_recall, token_object_cover
from .tasks import EvalItem

RANDOM_SEEDS = (0, 1, 2)


def evaluate(adapter, items: Iterable[EvalItem], methods: list[str], budgets: list, params: dict,
             task: str, text_mode: str = "question", max_new_tokens: int = 8, progress=None,
             batch: bool = True, encode_batch: int = 8, equal_compute: float | None = None) -> list[dict]:
    """Answers for every (item, method, budget, seed); returns the aggregated rows.

    A method that raises (or breaks the selection contract) on an item costs only its own records: they
    are counted in its rows' `failed` with the sentence in `error`, and every other method's rows complete.

    batch: per item, the unpruned answer and every pre-LLM (method, budget, seed) answer decode as
    one batch (`mipruner.answer_batch`; in-LLM methods answer one by one); batch=False answers
    each alone. Greedy tokens are the same either way except at float near-ties of two logits.
    encode_batch: items per vision-tower call (`mipruner.serve.batch.encode_items`; 1: one by one).
    equal_compute: a share of the unpruned prefill FLOPs (e.g. 0.3): per item and method, of `budgets`
    (the candidates) the one whose compute (`mipruner.measure.compute`) is closest to it is answered (ties: the
    first listed); the rows' budget reads "~30% FLOPs", `chosen` lists the budgets taken and `same_flops`
    the other candidates whose compute equals a taken one's exactly (e.g. a method that withdraws every
    visual token at one layer costs the same at any K): the table names them all.
    Every row's `flops` is the mean share of the unpruned prefill FLOPs its selections imply.
    """
    from mipruner.serve.batch import encode_items

    items = list(items)
    signals = mipruner.signals_for(m for m in methods if m != "none")  # every method's, one tower pass
    records = []  # (method, budget, seed, item, prediction, recall)
    bar = progress(total=len(items), desc=f"eval {task}") if progress else None
    step = max(1, int(encode_batch))
    encs: list = []
    settings = [(m, b, s) for m in methods if m != "none" for b in budgets
                for s in (RANDOM_SEEDS if "seed" in get_pruner(m).param_names else (None,))]
    for n, item in enumerate(items):
        if n % step == 0:  # the next group's encodings, one tower call where the family batches it
            encs = encode_items(adapter, [(it.media, it.question) for it in items[n:n + step]], batch=step,
                                text_mode=text_mode, signals=signals)
            caches = [{} for _ in encs]
            picked = _select_group(adapter, encs, caches, settings, params)
        enc, cache = encs[n % step], caches[n % step]
        cover = token_object_cover(enc.geometry, item.masks) if item.masks is not None else None
        runs, sels, errors = [("none", "all", None, ())], [None], [None]
        for m in methods:
            if m == "none":
                continue
            seeds = RANDOM_SEEDS if "seed" in get_pruner(m).param_names else (None,)
            for s in seeds:
                tried = [(b, *picked[(m, b, s)][n % step]) for b in budgets]
                tied = []
                if equal_compute is not None:
                    pick = closest_compute(tried, equal_compute)
                    tried, tied = [pick], same_compute(tried, pick)
                for b, sel, why in tried:
                    runs.append((m, b, s, tuple(tied)))
                    sels.append(sel)
                    errors.append(why)
        answers = _answers(adapter, enc, runs, sels, errors, cache, max_new_tokens, batch)
        for (m, b, s, tied), sel, out, why in zip(runs, sels, answers, errors):
            if sel is None:
                rec = 1.0 if cover is not None and why is None else math.nan
            else:
                rec = query_recall(sel.keep, cover) if cover is not None else math.nan
            share = flops_share(sel)
            label = b if equal_compute is None or m == "none" else equal_label(equal_compute)
            records.append((m, label, s, item, None if out is None else out.text, rec,
                            enc.n_visual if sel is None else sel.budget, why, share, b,
                            None if sel is None else withdrawn_at(sel), tied))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return aggregate(records, task)


def _select_group(adapter, encs: list, caches: list, settings: list, params: dict) -> dict:
    """{(method, budget, seed): [(selection, None) or (None, the sentence) per encoding]}: each setting's
    selections of the group's encodings as one batched call where the method allows it
    (`mipruner.select_batch`); when that raises, each encoding alone, so a failure costs only its own item."""
    out = {}
    for m, b, s in settings:
        kw = params if s is None else {**params, "seed": s}
        sels, why = guarded(m, lambda m=m, b=b, kw=kw: mipruner.select_batch(adapter, encs, m, b, caches=caches,
                                                                              strict=False, **kw))
        if why is None:
            out[(m, b, s)] = [(sel, None) for sel in sels]
            continue
        out[(m, b, s)] = [guarded(m, lambda e=e, c=c, m=m, b=b, kw=kw: mipruner.select(adapter, e, m, b, cache=c,
                                                                                        strict=False, **kw))
                          for e, c in zip(encs, caches)]
    return out


def _answers(adapter, enc, runs, sels, errors, cache, max_new_tokens: int, batch: bool) -> list:
    """The answers of the runs whose selection succeeded (None for the others); a run whose answer fails
    records its sentence in `errors` and costs only its own row (`answer_batch_guarded`)."""
    ok = [i for i, e in enumerate(errors) if e is None]
    answers = [None] * len(runs)
    got, whys = answer_batch_guarded(adapter, enc, [sels[i] for i in ok], max_new_tokens=max_new_tokens,
                                     cache=cache, batch=batch)
    for i, a, why in zip(ok, got, whys):
        answers[i], errors[i] = a, why
    return answers


def flops_share(sel) -> float:
    """The share of the unpruned prefill FLOPs `sel` implies (None: the unpruned run, 1.0; nan when
    the model has no decoder to count)."""
    if sel is None:
        return 1.0
    c = sel.extras.get("compute")
    return math.nan if c is None else float(c.flops_share)


def equal_label(target: float) -> str:
    return f"~{100 * target:g}% FLOPs"


def closest_compute(tried: list, target: float) -> tuple:
    """Of (budget, selection, error) tuples, the one whose FLOPs share is closest to `target` (the
    first on ties); the first failed one when none succeeded."""
    ok = [t for t in tried if t[1] is not None and not math.isnan(flops_share(t[1]))]
    if not ok:
        return tried[0]
    return min(ok, key=lambda t: abs(flops_share(t[1]) - target))


def same_compute(tried: list, pick: tuple) -> list:
    """The budgets of `tried` other than `pick`'s whose selections imply exactly its FLOPs share (the
    shares are ratios of integer FLOPs: equal compute gives equal floats)."""
    if pick[1] is None:
        return []
    share = flops_share(pick[1])
    return [t[0] for t in tried if t is not pick and t[1] is not None and flops_share(t[1]) == share]


def _withdrawn(layers: list) -> str:
    """"all withdrawn from layer k" (or layers k1/k2) when selections withdrew every visual token."""
    return "" if not layers else "all withdrawn from layer " + "/".join(str(x) for x in sorted(layers))


def _mean(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def aggregate(records, task: str) -> list[dict]:
    """Rows {method, budget, task, split, acc, f1, yes_rate, query_recall, n, kept, failed, error}; seeds
    averaged. A record may carry a 7th field, the visual tokens that reached the LLM (the budget, or the K
    an adaptive method chose; `kept` is their mean), and an 8th, the sentence of its failure: failed
    records are counted in `failed` (the first sentence in `error`) and left out of the scores. Then
    its FLOPs share, the budget taken, the layer it withdrew every visual token from and the budgets
    of equal compute not taken (`flops`, `chosen`, `withdrawn`, `same_flops`)."""
    groups, failed = defaultdict(list), defaultdict(list)
    kept = defaultdict(list)  # visual tokens that reached the LLM (an adaptive method's chosen K)
    flops, chosen = defaultdict(list), defaultdict(list)  # FLOPs shares; budgets taken (equal compute)
    same = defaultdict(list)  # budgets not taken whose compute equals a taken one's (equal compute)
    withdrawn = defaultdict(list)  # layers from which a selection withdrew every visual token
    for m, b, s, item, pred, rec, *extra in records:
        k, why, share, taken, gone, tied = (list(extra) + [None] * 6)[:6]
        if why:
            failed[(m, b)].append(why)
            continue
        groups[(m, b)].append((s, item, pred, rec))
        if k is not None:
            kept[(m, b)].append(k)
        if share is not None:
            flops[(m, b)].append(share)
        if taken is not None and taken not in chosen[(m, b)]:
            chosen[(m, b)].append(taken)
        if gone is not None and gone not in withdrawn[(m, b)]:
            withdrawn[(m, b)].append(gone)
        for t in tied or ():
            if t not in same[(m, b)]:
                same[(m, b)].append(t)
    rows = []
    for (m, b) in [k for k in failed if k not in groups]:  # every record of (method, budget) failed
        rows.append(dict(method=m, budget=b, task=task, split="all", n=0, acc=math.nan, f1=math.nan,
                         yes_rate=math.nan, query_recall=math.nan, kept=math.nan, flops=math.nan, chosen="",
                         same_flops="", withdrawn="", failed=len(failed[(m, b)]),
                         error=failed[(m, b)][0]))
    for (m, b), recs in groups.items():
        splits = sorted({it.split for _, it, _, _ in recs})
        per_split = []
        for split in splits:
            by_seed = defaultdict(list)
            for s, it, pred, rec in recs:
                if it.split == split:
                    by_seed[s].append((it, pred, rec))
            seed_rows = [_score(v) for v in by_seed.values()]
            row = {k: _mean([r[k] for r in seed_rows]) for k in ("acc", "f1", "yes_rate", "query_recall")}
            row.update(method=m, budget=b, task=task, split=split, n=seed_rows[0]["n"],
                       kept=_mean(kept[(m, b)]) if kept[(m, b)] else math.nan, failed=len(failed[(m, b)]),
                       error=(failed[(m, b)] or [None])[0], flops=_mean(flops[(m, b)]) if flops[(m, b)] else math.nan,
                       chosen=",".join(str(c) for c in chosen[(m, b)]),
                       same_flops=",".join(str(c) for c in same[(m, b)] if c not in chosen[(m, b)]),
                       withdrawn=_withdrawn(withdrawn[(m, b)]))
            per_split.append(row)
        rows += per_split
        if len(per_split) > 1:
            avg = average_splits(per_split, ("acc", "f1", "yes_rate", "query_recall"))
            avg.update(method=m, budget=b, task=task, split="average", n=sum(r["n"] for r in per_split),
                       kept=per_split[0]["kept"], failed=len(failed[(m, b)]), error=(failed[(m, b)] or [None])[0],
                       flops=per_split[0]["flops"], chosen=per_split[0]["chosen"],
                       same_flops=per_split[0]["same_flops"],
                       withdrawn=per_split[0]["withdrawn"])
            rows.append(avg)
    return rows


def _score(recs) -> dict:
    items = [it for it, _, _ in recs]
    preds = [p for _, p, _ in recs]
    recall = _mean([r for _, _, r in recs])
    if all(it.kind == "yesno" for it in items):
        m = pope_metrics(preds, [it.answer for it in items])
        return {"acc": m["acc"], "f1": m["f1"], "yes_rate": m["yes_rate"], "query_recall": recall, "n": m["n"]}
    acc = open_metrics(preds, [it.answer for it in items])["acc"]
    return {"acc": acc, "f1": math.nan, "yes_rate": math.nan, "query_recall": recall, "n": len(items)}


def format_rows(rows: list[dict]) -> str:
    """A paper-style table: one line per method x budget x split."""
    from mipruner.measure.text_table import table

    fmt = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"  # noqa: E731
    kept = lambda r: ("-" if math.isnan(r.get("kept", math.nan)) else f"{r['kept']:.1f}") \
        + (f" ({r['withdrawn']})" if r.get("withdrawn") else "")  # noqa: E731
    flops = lambda r: "-" if math.isnan(r.get("flops", math.nan)) else f"{100 * r['flops']:.1f}%"  # noqa: E731
    budget = lambda r: str(r["budget"]) + (f" (K={r['chosen']}" + (f"; same FLOPs at K={r['same_flops']}"
                                                                    if r.get("same_flops") else "") + ")"
                                           if r.get("chosen") and str(r["chosen"]) != str(r["budget"])
                                           else "")  # noqa: E731
    body = [[r["method"], budget(r), r["split"], fmt(r["acc"]), fmt(r["f1"]), fmt(r["yes_rate"]),
             fmt(r["query_recall"]), kept(r), flops(r), str(r["n"])] for r in rows]
    return table(body, ["method", "budget", "split", "acc", "f1", "yes_rate", "query_recall", "kept", "flops", "n"])


