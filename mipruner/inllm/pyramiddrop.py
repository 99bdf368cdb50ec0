"""PyramidDrop (Xing et al., "PyramidDrop: Accelerating Your Large Vision-Language Models via Pyramid
Visual Redundancy Reduction", arXiv 2410.17247), the package's built-in `pdrop`: the rule of the example
plug-in `examples/pyramiddrop` (registered there as `pyramiddrop`, written only on the public API), here
in the package so that it is in the app, the eval, the sweeps and the benches without installing it.

Original: Cooperx521/PyramidDrop, `llava/model/modeling_llama_pdrop.py`, `LlamaModel.pdrop_forward`
(the stages and the decoding positions) and `LlamaModel.pdrop_rank_drop` (one stage's ranking);
the evaluated settings in `llava/eval/model_vqa_loader.py` and `scripts/v1_5/pdrop_eval/*.sh`:
`layer_list [8, 16, 24]` of 32 layers, `image_token_ratio_list [0.5, 0.25, 0.125]` (1.0 prepended).

The released rule, per stage s at layer K_s (after layer K_s - 1 ran):
  * the query is the last instruction token (the prompt's last token at inference);
  * its attention is the one layer K_s itself would compute on its input: `input_layernorm`, its
    `q_proj` / `k_proj`, rotary at the CURRENT position ids, the causal mask, softmax, mean over heads;
  * the image tokens present are ranked by it; the top `int(N_V * ratio_s)` stay (topk, then sorted
    back into sequence order); the others leave the sequence for every later layer;
  * position ids are renumbered `arange(0, L')` after each drop; while decoding, a new token's
    position drops by the visual tokens removed at each stage it passes
    (`position_ids - (cur_visual_length - next_visual_length)`).
Ours: the same rule through `StageView.attention("last", layer="this")`, `positions="renumber"`
(each remaining row moves down by the rows dropped before it: exactly the release's arange on a
1-D-position LLM; decoding continues from there).

Budget: K = the visual tokens that survive the last stage (`Selection.keep`). Stage counts:
int(N_V * ratio^s) for the earlier stages (floored, as the release's `int`), never below K, and K at
the last: at N_V = 576 and ratio 0.5, K = 72 is the release's 288 / 144 / 72. Layers: round(s * depth
/ 4) for s = 1, 2, 3 (8, 16, 24 of 32), min(3, depth - 1) stages (the last ones on a shallow decoder),
strictly increasing. K = N_V keeps everything at every stage: the unpruned model, bit for bit.

Deliberate deviations: scores in float32 (the release casts the softmax back to fp16 before the head
mean); ties to the lower index (stable sort; the release's topk leaves them to the kernel); grouped-
query heads read their KV head (the release's matmul assumes as many KV heads as query heads); on
M-RoPE families (Qwen) the three position components move down together (the release is LLaVA-only).
"""
from __future__ import annotations

import math

import torch

from ..pruners._registry import Param
from ..pruners.selection import Selection
from .api import DecoderRun, register_inllm

RELEASED_DEPTH = 32
RELEASED_LAYERS = (8, 16, 24)
RATIO = Param.real("pdrop_ratio", 0.5, 0.0, 1.0, "share of the image tokens each earlier stage keeps, compounded "
                   "(PyramidDrop: 0.5; the last stage keeps the budget)", low_open=True, code="pdr", step=0.05)


def schedule(budget: int, n_visual: int, n_layers: int, ratio: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(layers, counts) of the stages keeping K = `budget` of N_V tokens on a decoder of `n_layers`."""
    m = max(1, min(len(RELEASED_LAYERS), n_layers - 1))
    layers: list[int] = []
    for s, k_s in enumerate(RELEASED_LAYERS[len(RELEASED_LAYERS) - m:]):
        lo, hi = max(s + 1, layers[-1] + 1 if layers else 1), max(1, n_layers - m + s)
        layers.append(min(max(math.floor(n_layers * k_s / RELEASED_DEPTH + 0.5), lo), hi))
    powers = range(len(RELEASED_LAYERS) - m + 1, len(RELEASED_LAYERS) + 1)
    counts, prev = [], n_visual
    for p in list(powers)[:-1]:
        prev = max(budget, min(prev, int(n_visual * ratio ** p)))
        counts.append(prev)
    return tuple(layers), (*counts, budget)


@register_inllm("pdrop", label="PyramidDrop", params=(RATIO,), positions="renumber",
                score_label="stages survived + last-token attention")
@torch.no_grad()
def pdrop(run: DecoderRun, budget: int, *, pdrop_ratio: float = 0.5) -> Selection:
    """PyramidDrop: the last instruction token's attention drops image tokens at three layers in turn."""
    layers, counts = schedule(budget, run.n_visual, run.n_layers, pdrop_ratio)
    vis = run.visual_positions
    dev = vis.device
    survived = torch.zeros(run.n_visual, dtype=torch.long, device=dev)
    scores = torch.zeros(run.n_visual, dtype=torch.float32, device=dev)
    order = vis[:0]
    for layer, count in zip(layers, counts):
        view = run.at(layer)
        row = view.attention("last", layer="this")[0]  # (L_cur,) layer K's own attention, current positions
        present = view.visual  # (n,) indices into N_V, ascending
        s = row.index_select(0, view.columns(vis[present]))  # (n,)
        ranked = torch.sort(s, descending=True, stable=True).indices[:count]
        order = present[ranked]
        survived[order] += 1
        scores[present] = s
        run.keep(view, order)
    sel = Selection.from_order(order, survived.float() + scores)
    sel.extras.update(layers=torch.tensor(layers), counts=torch.tensor(counts), survived=survived.cpu(),
                      pdrop_ratio=float(pdrop_ratio))
    return sel


__all__ = ["RATIO", "pdrop", "schedule"]
