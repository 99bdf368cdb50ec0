"""`python -m mipruner.lmms.make_tasks --out DIR`: the embedded model's tasks as local lmms-eval tasks.

Writes, for `--include_path DIR`:
  shapes_pope_{random,popular,adversarial}  POPE on the synthetic scenes, group `shapes_pope`
  shapes_open                               colour and count questions (one-word answers)
  shapes_video                              the same questions about 8-frame clips
with one Parquet file per task under DIR/data (images stored losslessly as PNG by the `datasets`
Image feature) and `data_files` relative to the YAMLs, so the folder can be moved. The items are
`mipruner.eval.shapes.shapes_items(task, n, seed)`, the very items of
`python -m mipruner.eval --task shapes-pope --n N --seed S`, in the same order; each row keeps the
item's id. Prompts are the bare questions (the embedded model was trained on them) and answers
get at most 8 new tokens, as in `python -m mipruner.eval`.

`--pope-yamls DIR` writes the `mipruner_pope` YAMLs shipped in `mipruner/lmms/tasks` (POPE from
lmms-lab on the Hub, lmms-eval's prompt, our scoring).
"""
from __future__ import annotations

import argparse
import os

from mipruner.shapes.scenes import POPE_SPLITS

FN = "!function mipruner.lmms.tasks"
POPE_METRICS = ("acc", "f1", "yes_rate", "precision", "recall")
LMMS_INSTRUCTION = "\\nAnswer the question using a single word or phrase."  # lmms-eval's POPE post_prompt


def task_yaml(task: str, dataset: str, split: str, kind: str, post_prompt: str, max_new_tokens: int,
              visual: str = "image_doc_to_visual", extra: str = "") -> str:
    """One generate_until task: kind "pope" (POPE metrics) or "open" (accuracy of one-word answers)."""
    if kind == "pope":
        process = "pope_process_results"
        metrics = "".join(f"  - metric: {m}\n    aggregation: {FN}.pope_{m}\n    higher_is_better: "
                          f"{'true' if m != 'yes_rate' else 'false'}\n" for m in POPE_METRICS)
    else:
        process = "open_process_results"
        metrics = f"  - metric: acc\n    aggregation: {FN}.open_acc\n    higher_is_better: true\n"
    return (f"task: {task}\n{dataset}test_split: {split}\noutput_type: generate_until\n"
            f"doc_to_visual: {FN}.{visual}\ndoc_to_text: {FN}.question_doc_to_text\ndoc_to_target: answer\n"
            f"generation_kwargs:\n  max_new_tokens: {max_new_tokens}\n  temperature: 0\n  do_sample: false\n"
            f"  num_beams: 1\nprocess_results: {FN}.{process}\nmetric_list:\n{metrics}"
            f"lmms_eval_specific_kwargs:\n  default:\n    pre_prompt: \"\"\n    post_prompt: \"{post_prompt}\"\n"
            f"metadata:\n  version: 1.0\n{extra}")


def group_yaml(group: str, tasks: list[str]) -> str:
    """A group whose accuracy, F1 and yes-rate are the unweighted means over its tasks (the paper's average)."""
    agg = "".join(f"  - metric: {m}\n    aggregation: mean\n    weight_by_size: false\n"
                  for m in ("acc", "f1", "yes_rate"))
    return f"group: {group}\ntask:\n" + "".join(f"  - {t}\n" for t in tasks) + f"aggregate_metric_list:\n{agg}" \
        "metadata:\n  version: 1.0\n"


def write_pope_yamls(out: str) -> list[str]:
    """The `mipruner_pope` tasks: POPE (lmms-lab-encoder/POPE, config Full) with our scoring."""
    os.makedirs(out, exist_ok=True)
    ds = "dataset_path: lmms-lab-encoder/POPE\ndataset_name: Full\ndataset_kwargs:\n  token: true\n"
    names = []
    for split in POPE_SPLITS:
        names.append(f"mipruner_pope_{split}")
        with open(os.path.join(out, f"{names[-1]}.yaml"), "w") as f:
            f.write(task_yaml(names[-1], ds, split, "pope", LMMS_INSTRUCTION, 128))
    with open(os.path.join(out, "mipruner_pope.yaml"), "w") as f:
        f.write(group_yaml("mipruner_pope", names))
    return names


def _local(name: str) -> str:
    return f"dataset_path: parquet\ndataset_kwargs:\n  data_files:\n    test: data/{name}.parquet\n"


def _write_parquet(path: str, rows: list[dict], video: bool) -> None:
    import datasets

    feats = {"id": datasets.Value("string"), "question": datasets.Value("string"),
             "answer": datasets.Value("string"), "split": datasets.Value("string")}
    if video:
        feats.update(frames=datasets.Sequence(datasets.Image()), fps=datasets.Value("float32"))
    else:
        feats["image"] = datasets.Image()
    cols = {k: [r[k] for r in rows] for k in feats}
    datasets.Dataset.from_dict(cols, features=datasets.Features(feats)).to_parquet(path)


def _rows(items, video: bool) -> list[dict]:
    rows = []
    for it in items:
        row = {"id": it.id, "question": it.question, "answer": it.answer, "split": it.split}
        if video:
            row.update(frames=list(it.media.frames), fps=float(it.media.fps))
        else:
            row["image"] = it.media
        rows.append(row)
    return rows


def write_shapes_tasks(out: str, n: int = 60, seed: int = 1234, tasks=("pope", "open", "video")) -> list[str]:
    """Data + YAMLs of the shapes tasks under `out`; returns the task and group names written."""
    from mipruner.eval.shapes import shapes_items

    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    meta = f"  seed: {seed}\n  n: {n}\n"
    written = []
    if "pope" in tasks:
        items = shapes_items("shapes-pope", n=n, seed=seed)
        names = []
        for split in POPE_SPLITS:
            name = f"shapes_pope_{split}"
            rows = _rows([i for i in items if i.split == split], False)
            _write_parquet(os.path.join(out, "data", f"{name}.parquet"), rows, False)
            with open(os.path.join(out, f"{name}.yaml"), "w") as f:
                f.write(task_yaml(name, _local(name), "test", "pope", "", 8, extra=meta))
            names.append(name)
        with open(os.path.join(out, "shapes_pope.yaml"), "w") as f:
            f.write(group_yaml("shapes_pope", names))
        written += names + ["shapes_pope"]
    for kind in ("open", "video"):
        if kind not in tasks:
            continue
        name = f"shapes_{kind}"
        video = kind == "video"
        items = shapes_items(f"shapes-{kind}", n=n, seed=seed)
        _write_parquet(os.path.join(out, "data", f"{name}.parquet"), _rows(items, video), video)
        with open(os.path.join(out, f"{name}.yaml"), "w") as f:
            f.write(task_yaml(name, _local(name), "test", "open", "", 8,
                              visual="clip_doc_to_visual" if video else "image_doc_to_visual", extra=meta))
        written.append(name)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mipruner.lmms.make_tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for the shapes tasks (YAMLs + data/)")
    p.add_argument("--n", type=int, default=60, help="items (per POPE split for shapes_pope), as mipruner.eval --n")
    p.add_argument("--seed", type=int, default=1234, help="scene seed (1234 is held out from training)")
    p.add_argument("--tasks", default="pope,open,video", help="which of pope, open, video")
    p.add_argument("--pope-yamls", metavar="DIR", help="write the mipruner_pope YAMLs (Hub data) to DIR")
    a = p.parse_args(argv)
    if not a.out and not a.pope_yamls:
        p.error("give --out DIR (shapes tasks) and/or --pope-yamls DIR")
    if a.n < 1:
        p.error("--n must be >= 1")
    kinds = [t.strip() for t in a.tasks.split(",") if t.strip()]
    bad = sorted(set(kinds) - {"pope", "open", "video"})
    if bad:
        p.error(f"unknown --tasks {bad}; choose from pope, open, video")
    if a.pope_yamls:
        print("wrote", ", ".join(write_pope_yamls(a.pope_yamls)), "to", a.pope_yamls)
    if a.out:
        print("wrote", ", ".join(write_shapes_tasks(a.out, a.n, a.seed, kinds)), "to", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
