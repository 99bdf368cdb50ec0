"""The CLIP tower's attention for the vision-stage methods: which encoder layer the features come
from, a forward hook (removed on exit) that captures that layer's attention probabilities and keys
(`record`: of every block a `Signals` request asks for, per head too, and the projector's input),
the per-view [CLS] attention of multi-view inputs, and the projected [CLS] token."""
from __future__ import annotations

import contextlib

import torch


def encoder_layers(tower) -> torch.nn.ModuleList:
    """The transformer blocks of a CLIP/SigLIP-style vision tower (transformers 5: `encoder.layers`)."""
    for name in ("encoder.layers", "vision_model.encoder.layers"):
        try:
            return tower.get_submodule(name)
        except AttributeError:
            continue
    raise RuntimeError(f"cannot find the encoder layers of {type(tower).__name__}")


def feature_layer_index(feature_layer, n_layers: int) -> int:
    """The block whose output is `hidden_states[feature_layer]` (hidden_states[0] = embeddings).

    A list of feature layers (multi-layer features) uses the last one listed.
    """
    h = feature_layer[-1] if isinstance(feature_layer, (list, tuple)) else int(feature_layer)
    h = h if h >= 0 else n_layers + 1 + h
    return min(max(h - 1, 0), n_layers - 1)


@contextlib.contextmanager
def capture_attention(tower, layer_index: int):
    """Collect head-averaged attention probabilities and keys of one vision block.

    Yields a dict filled during the forward: "attention" (B, N+1, N+1) and "keys" (B, N+1, d_head),
    float32. The hooks are removed on exit, whatever happens. Needs eager attention in the tower
    (SDPA returns no probabilities), which `load_model` sets up.
    """
    attn = encoder_layers(tower)[layer_index].self_attn
    with capture_block(attn, attn.k_proj) as out:
        yield out


def record(tower, want, feature_layer, projector):
    """The `signals.Record` of a CLIP/SigLIP tower: its blocks' attention and keys, the default block being
    the one whose output is `hidden_states[feature_layer]`, and `projector`'s input as the features."""
    from .signals import Record

    layers = encoder_layers(tower)
    n = len(layers)
    return Record(want, n, feature_layer_index(feature_layer, n),
                  lambda b, heads: capture_block(layers[b].self_attn, layers[b].self_attn.k_proj, heads=heads),
                  projector)


@contextlib.contextmanager
def capture_block(attn, keys_module, heads: bool = False):
    """The hooks behind `capture_attention`, for any vision attention module `attn` that returns
    (output, probabilities) and has `num_heads` / `head_dim`; `keys_module` is the submodule whose
    output (B, N+1, H * d_head) is the keys (CLIP/SigLIP: `k_proj`; InternViT: `k_norm`).
    heads: also keep the per-head maps, "heads" (B, H, N+1, N+1) float32 (only when a method asks)."""
    out: dict[str, torch.Tensor] = {}

    def on_attn(_module, _inputs, output):
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError("the vision tower returned no attention probabilities: load the model with "
                               "vision_attn='eager' to capture attention")
        # (B, H, N+1, N+1) -> (B, N+1, N+1), accumulated in float32 without a float32 copy of every head's
        # map (a bf16 tower's per-head maps, e.g. LLaVA-NeXT's 5 views x 16 heads x 577^2, would double)
        out["attention"] = weights.detach().mean(dim=1, dtype=torch.float32)
        if heads:
            out["heads"] = weights.detach().float()  # (B, H, N+1, N+1)

    def on_keys(_module, _inputs, output):
        b, n, _ = output.shape
        k = output.detach().float().view(b, n, attn.num_heads, attn.head_dim)  # (B, N+1, H, d_head)
        out["keys"] = k.mean(dim=2)  # (B, N+1, d_head)

    handles = [attn.register_forward_hook(on_attn), keys_module.register_forward_hook(on_keys)]
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def views_attention(att_all: torch.Tensor, keys_all: torch.Tensor, view: torch.Tensor, pos: torch.Tensor):
    """Per-view tower attention (views, n+1, n+1) and keys (views, n+1, d_head) -> the pruners' form
    over all N_V visual tokens: (N_V+1, N_V+1) with [CLS] first and keys (N_V+1, d_head).

    view (N_V,): the view (image, tile, frame) each token comes from, -1 for tokens the tower never
    saw (LLaVA-NeXT's newlines); pos (N_V,): its index within the view, [CLS] = 0. Row 0 holds each
    token's [CLS] attention within its own view; tokens of different views get 0; key 0 is view 0's
    [CLS] key. Built on `att_all`'s device (no host round trip when the tower's maps are on the GPU).
    """
    dev = att_all.device
    view, pos = view.to(dev), pos.to(dev)
    seen = view >= 0
    v = view.clamp_min(0)
    p = pos.clamp_min(0)
    n = int(view.numel())
    att = torch.zeros(n + 1, n + 1, dtype=att_all.dtype, device=dev)
    zero = torch.zeros((), dtype=att_all.dtype, device=dev)
    att[0, 1:] = torch.where(seen, att_all[v, 0, p], zero)
    same = (view[:, None] == view[None, :]) & seen[:, None] & seen[None, :]  # (N_V, N_V)
    att[1:, 1:] = torch.where(same, att_all[v[:, None], p[:, None], p[None, :]], zero)
    keys = torch.zeros(n + 1, keys_all.shape[-1], dtype=keys_all.dtype, device=dev)
    keys[0] = keys_all[0, 0]
    keys[1:] = torch.where(seen[:, None], keys_all[v, p], torch.zeros((), dtype=keys_all.dtype, device=dev))
    return att, keys


def projected_cls(model, outputs) -> torch.Tensor | None:
    """(views, d): each view's [CLS] hidden state at the feature layer(s), through the projector, or
    None under the "full" strategy (there the [CLS] is already a visual token). `outputs`: what
    `get_image_features` returned (its `hidden_states`, as the model selects them)."""
    cfg = model.config
    if getattr(cfg, "vision_feature_select_strategy", "default") != "default" or outputs.hidden_states is None:
        return None
    layers = cfg.vision_feature_layer
    layers = list(layers) if isinstance(layers, (list, tuple)) else [layers]
    h = torch.cat([outputs.hidden_states[i][:, 0] for i in layers], dim=-1)  # (views, D_v), as the model concatenates
    return model.model.multi_modal_projector(h)  # (views, d)
