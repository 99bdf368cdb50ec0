"""DART (Wen et al. 2025, "Stop Looking for Important Tokens in Multimodal Language Models:
Duplication Matters More").

Original: ZichenWen1/DART, `modeling_llama_self.py` `get_retained_image_token` (called from the
patched `LlamaModel.forward` at layer K).

Rule, at decoder layer K (original K = 2):
  1. pivots: the `image_pivots` image tokens and the `text_pivots` text tokens with the largest L1
     norm of their layer K-1 keys (heads concatenated). Text candidates are the tokens after the
     last image token (the question and the answer prompt), as in the original. Original: 4 + 4.
  2. the pivots are visited in the order CPython iterates `set(absolute positions)` (below); each
     pivot in turn takes the Q remaining image tokens LEAST similar to it (cosine of the hidden
     states entering layer K, after the model's final norm, as in the original) out of the pool.
  3. kept = image pivots + the picks (text pivots are not image tokens and are not counted).

Visit order. The release builds `indices_set = set(image_indices + query_indices)` (absolute
sequence positions; image pivots by descending key norm, then text pivots) and walks
`list(indices_set.copy())`. For ints, hash(x) = x, and CPython stores a set in a table of 2^k
slots, so the walk is in slot order: x goes to slot x mod 2^k, or, when taken, to the next free
one of the following LINEAR_PROBES = 9 slots (if they fit in the table), else along the
perturbation sequence i <- (5 i + 1 + perturb) mod 2^k, perturb >>= 5; the table starts at 8
slots and is rebuilt (slot order, same probing) with the smallest 2^k > 4 x used once 5 fill > 3 mask.
For the release's 8 pivots the table has 32 slots, so pivots go by position mod 32 (collisions
probed). `set_order` restates this without relying on the interpreter; a test checks it against
`list(set(...))` of the running one.

Count (`count_rule`):
  "budget"   (default) exactly `budget` image tokens, so DART compares with every other method at
             equal K: min(image_pivots, K) image pivots, and the other K - P_i picks shared out as
             evenly as possible over the pivots in visit order (the first visited get one more).
  "original" the release's count: each pivot takes floor(K / (image_pivots + text_pivots)) tokens,
             i.e. 4 + 8 floor(K / 8) kept with the default pivots (68 at K = 64, 132 at 128),
             capped at N_V (a pivot takes what is left when the pool runs dry, where the release fails).
With the same count and visit order the selections agree with the release token for token (tested
on random tensors against a transcription of the released function).

Deliberate deviations: the budget count above (default); ties (equal key norms or cosines) go to
the lower index (stable sorts; the release leaves them to topk); pivot counts larger than the
candidates are capped (the release fails in topk); on Qwen the keys are taken after rotary and
with grouped-query heads, as that model's attention stores them.
"""
from __future__ import annotations

import torch

from ..pruners._registry import Param
from ..pruners.selection import Selection, unit_rows
from .api import DecoderRun, register_inllm
from .fastv import LAYER

COUNT_RULES = ("budget", "original")
_LINEAR_PROBES, _PERTURB_SHIFT, _MIN_SIZE = 9, 5, 8  # CPython's setobject.c constants


def _top(values: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(values, descending=True, stable=True).indices[:k]


def _probe(table: list, x: int) -> int:
    """The slot CPython's set probing gives to int x (hash x) in `table` (x not in it)."""
    mask = len(table) - 1
    i, perturb = x & mask, x
    while True:
        for j in range(i, i + (_LINEAR_PROBES if i + _LINEAR_PROBES <= mask else 0) + 1):
            if table[j] is None:
                return j
        perturb >>= _PERTURB_SHIFT
        i = (i * 5 + 1 + perturb) & mask


def _rebuilt(table: list, size: int) -> list:
    new: list = [None] * size
    for x in table:  # slot order
        if x is not None:
            new[_probe(new, x)] = x
    return new


def _table_size(minused: int) -> int:
    size = _MIN_SIZE
    while size <= minused:
        size <<= 1
    return size


def set_order(values: list[int]) -> list[int]:
    """`list(set(values).copy())` for distinct-or-not non-negative ints below 2**61 - 1, restated:
    CPython's set insertion (open addressing, linear probes, perturbation, growth) and copy."""
    table: list = [None] * _MIN_SIZE
    used = 0
    for x in values:
        if x < 0 or x >= 2**61 - 1:
            raise ValueError(f"set_order takes positions in [0, 2**61 - 1), got {x}")
        if x in table:
            continue
        table[_probe(table, x)] = x
        used += 1
        if used * 5 >= (len(table) - 1) * 3:  # no deletions here, so fill == used
            table = _rebuilt(table, _table_size(used * 4 if used <= 50000 else used * 2))
    # set.copy(): one resize of the empty copy up front when needed, then a slot-by-slot copy or reinsertion
    size = _table_size(used * 2) if used * 5 >= (_MIN_SIZE - 1) * 3 else _MIN_SIZE
    if size != len(table):
        table = _rebuilt(table, size)
    return [x for x in table if x is not None]


def pick_quotas(n_piv: int, budget: int, n_image_pivots: int, image_pivots: int, text_pivots: int,
                n_v: int, count_rule: str) -> list[int]:
    """Picks per pivot, in visit order (host ints). See the module doc for the two rules."""
    if count_rule == "original":
        each = budget // max(image_pivots + text_pivots, 1)
        quotas, pool = [], n_v - n_image_pivots
        for _ in range(n_piv):
            q = min(each, pool)
            quotas.append(q)
            pool -= q
        return quotas
    rest = budget - n_image_pivots
    if rest > 0 and n_piv == 0:
        raise ValueError("DART has no pivots: set image_pivots or text_pivots >= 1")
    return [rest // n_piv + (1 if j < rest % n_piv else 0) for j in range(n_piv)] if rest > 0 else [0] * n_piv


def dart_rank(key_l1_image: torch.Tensor, key_l1_text: torch.Tensor, hidden_image: torch.Tensor,
              hidden_text: torch.Tensor, budget: int, image_pivots: int = 4, text_pivots: int = 4, *,
              image_positions: torch.Tensor | None = None, text_positions: torch.Tensor | None = None,
              count_rule: str = "budget") -> Selection:
    """DART's kept set over N_V image tokens (see module doc).

    key_l1_image (N_V,), key_l1_text (N_T,): L1 norms of the layer K-1 keys; hidden_image (N_V, d),
    hidden_text (N_T, d): normed hidden states entering layer K; image_positions (N_V,),
    text_positions (N_T,): their absolute sequence positions (the visit order); default: the image
    at 0..N_V-1, the text right after it. Returns a Selection with order = image pivots (by key
    norm), then each pivot's picks in visit order; scores (N_V,) = -cos to the pivot that picked the
    token, 1.0 for image pivots, -max cos to any pivot for tokens never picked; extras:
    pivots_image (indices into N_V), pivots_text (indices into N_T), visit (pivot positions in visit
    order), picked_by (N_V,) index into the visit order (-1: not picked; image pivots: their slot).
    """
    if count_rule not in COUNT_RULES:
        raise ValueError(f"count_rule must be one of {COUNT_RULES}, got {count_rule!r}")
    n_v, n_t = key_l1_image.shape[0], key_l1_text.shape[0]
    dev = hidden_image.device
    if image_positions is None:
        image_positions = torch.arange(n_v, device=dev)
    if text_positions is None:
        text_positions = n_v + torch.arange(n_t, device=dev)
    p_img = min(image_pivots, budget)
    img_piv = _top(key_l1_image.float().to(dev), p_img)  # (P_i,) by descending key norm
    txt_piv = _top(key_l1_text.float().to(dev), min(text_pivots, n_t))  # (P_t,)
    v = unit_rows(hidden_image.detach())  # (N_V, d)
    t = unit_rows(hidden_text.detach().to(dev))  # (N_T, d)
    piv_vec = torch.cat([v[img_piv], t[txt_piv]])  # (P, d): release's insertion order
    piv_pos = torch.cat([image_positions.to(dev)[img_piv], text_positions.to(dev)[txt_piv]]).tolist()  # one sync
    slot = {p: i for i, p in enumerate(piv_pos)}
    visit = [slot[p] for p in set_order(piv_pos)]  # rows of piv_vec in visit order
    piv_vec = piv_vec[torch.tensor(visit, dtype=torch.long, device=dev)] if visit else piv_vec
    quotas = pick_quotas(len(visit), budget, p_img, image_pivots, text_pivots, n_v, count_rule)

    cos = v @ piv_vec.T  # (N_V, P) in visit order
    scores = -cos.max(dim=1).values if visit else torch.zeros(n_v, device=dev)
    picked_by = torch.full((n_v,), -1, dtype=torch.long, device=dev)
    pool = torch.ones(n_v, dtype=torch.bool, device=dev)
    pool[img_piv] = False
    scores[img_piv] = 1.0
    img_slots = torch.tensor([visit.index(i) for i in range(p_img)], dtype=torch.long, device=dev)
    picked_by[img_piv] = img_slots
    order = [img_piv]
    floor = torch.tensor(-float("inf"), device=dev)
    for j, quota in enumerate(quotas):  # <= image_pivots + text_pivots rounds, no host sync
        if quota == 0:
            continue
        gain = torch.where(pool, -cos[:, j], floor)  # least similar first
        pick = _top(gain, quota)
        scores[pick] = gain[pick]
        picked_by[pick] = j
        pool[pick] = False
        order.append(pick)
    sel = Selection.from_order(torch.cat(order), scores)
    sel.extras.update(pivots_image=img_piv.cpu(), pivots_text=txt_piv.cpu(), picked_by=picked_by.cpu(),
                      visit=torch.tensor(set_order(piv_pos), dtype=torch.long))
    return sel


@register_inllm("dart", label="DART", score_label="-cosine to its pivot", params=(
    LAYER,
    Param.integer("image_pivots", 4, 0, None, "image pivot tokens, by L1 norm of layer K-1 keys (DART: 4)"),
    Param.integer("text_pivots", 4, 0, None, "text pivot tokens, from the tokens after the last image token "
                  "(DART: 4)"),
    Param.choice("count_rule", "budget", COUNT_RULES, "image tokens kept: exactly the budget K, or the released "
                 "code's image_pivots + (image_pivots + text_pivots) * floor(K / (image_pivots + text_pivots))",
                 code="dc")))
@torch.no_grad()
def dart(run: DecoderRun, budget: int, *, layer: int = 2, image_pivots: int = 4, text_pivots: int = 4,
         count_rule: str = "budget") -> Selection:
    """DART: pivot tokens by key norm, then the image tokens least similar to each pivot."""
    if image_pivots + text_pivots < 1:
        raise ValueError("image_pivots + text_pivots must be >= 1, got 0")
    view = run.at(layer)  # one stage at K, on the public in-LLM API (`mipruner.inllm.api`)
    vis, after = run.visual_positions, run.text_after  # the text candidates: tokens after the last image token
    key_l1 = view.key_norms()  # (L,) layer K-1 keys
    image, text = (view.hidden(rows, normed=True).float() for rows in (vis, after))  # entering layer K, final norm
    sel = dart_rank(key_l1[vis], key_l1[after], image, text, budget, image_pivots, text_pivots,
                    image_positions=vis, text_positions=after, count_rule=count_rule)
    run.keep(view, sel.keep)
    sel.extras["pivots_text_positions"] = after[sel.extras["pivots_text"].to(vis.device)].cpu()
    sel.extras.update(image_pivots=image_pivots, text_pivots=text_pivots, layer=view.layer, count_rule=count_rule)
    return sel
