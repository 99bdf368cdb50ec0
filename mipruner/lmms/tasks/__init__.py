"""lmms-eval task functions: POPE and open questions scored as `python -m mipruner.eval` scores them.

The YAMLs name these functions by module path (`!function mipruner.lmms.tasks.pope_acc`): the
YAMLs in this folder (POPE on lmms-lab's data set, `mipruner_pope`) and those that
`python -m mipruner.lmms.make_tasks` writes next to the synthetic data (`shapes_pope`,
`shapes_open`, `shapes_video`). Scoring is `mipruner.eval.metrics`, the module the eval runner
uses: POPE's accuracy, precision, recall, F1 ("yes" is the positive class; an answer that is
neither yes nor no counts as no) and the PREDICTED yes-rate, the share of answers that are "yes"
(lmms-eval's built-in `pope_yes_ratio` is the share of "yes" labels). The `mipruner_pope` and
`shapes_pope` groups average each metric over the three splits without weights, as the paper does.
"""
from __future__ import annotations

from mipruner.eval.metrics import open_metrics, pope_metrics

POPE_KEYS = ("acc", "f1", "yes_rate", "precision", "recall")


def image_doc_to_visual(doc):
    """[the document's image] (a PIL image from the data set's Image feature)."""
    return [doc["image"].convert("RGB")]


def clip_doc_to_visual(doc):
    """[one `mipruner.media.Video`] from a document's list of frames (a synthetic clip)."""
    from mipruner.media import Video

    frames = [f.convert("RGB") for f in doc["frames"]]
    return [Video(frames=frames, indices=list(range(len(frames))), fps=float(doc["fps"]), total_frames=len(frames))]


def question_doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kw = lmms_eval_specific_kwargs or {}
    return f"{kw.get('pre_prompt', '')}{doc['question'].strip()}{kw.get('post_prompt', '')}"


def pope_process_results(doc, results):
    """The answer and the label, for every POPE metric (each needs the whole split)."""
    rec = {"pred": results[0], "label": str(doc["answer"]).strip().lower()}
    return {k: rec for k in POPE_KEYS}


def _pope(items, key):
    return pope_metrics([r["pred"] for r in items], [r["label"] for r in items])[key]


def pope_acc(items):
    return _pope(items, "acc")


def pope_f1(items):
    return _pope(items, "f1")


def pope_yes_rate(items):
    return _pope(items, "yes_rate")


def pope_precision(items):
    return _pope(items, "precision")


def pope_recall(items):
    return _pope(items, "recall")


def open_process_results(doc, results):
    return {"acc": {"pred": results[0], "answer": str(doc["answer"])}}


def open_acc(items):
    return open_metrics([r["pred"] for r in items], [r["answer"] for r in items])["acc"]
