"""A CLIP tower run only up to the block the projector reads: LLaVA's `get_image_features` without the blocks
after `vision_feature_layer`.

transformers' `LlavaModel.get_image_features` runs every block of the vision tower and keeps
`hidden_states[vision_feature_layer]`: LLaVA-1.5 reads -2, so its last block (1 of 24) is computed and
thrown away. `image_features` computes the same hidden state through the tower's own public modules
(`embeddings`, `pre_layrnorm`, `encoder.layers[:j]`, each called as the encoder calls it:
`layer(hidden, None)`, the vision encoder's attention mask being None), then the model's own projector.
The same modules on the same inputs in the same order: the features are the full tower's, bit for bit
(tests/models/test_encode_path.py). Forward hooks on the blocks (attention recording, `common.signals.Record`)
and the projector's pre-hook (the `features` signal) fire as in the full pass; a block asked for beyond
the feature layer is run too (`upto`).

Used where the tower is a CLIP/SigLIP vision transformer with those modules, one int feature layer and no
`image_sizes` (LLaVA-1.5, Video-LLaVA images); anything else goes through `get_image_features` unchanged.
"""
from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling


def _vision_model(tower):
    """The module holding `embeddings`, `pre_layrnorm` and `encoder.layers`: the tower itself (transformers 5's
    `CLIPVisionModel`) or its `vision_model` (a `CLIPVisionTransformer` inside); None for other towers."""
    for vm in (tower, getattr(tower, "vision_model", None)):
        if vm is not None and all(hasattr(vm, n) for n in ("embeddings", "pre_layrnorm", "encoder")) \
                and hasattr(vm.encoder, "layers"):
            return vm
    return None


def applies(model, tower, feature_layer=None) -> bool:
    """Whether `image_features` can run `tower` (module doc)."""
    layer = model.config.vision_feature_layer if feature_layer is None else feature_layer
    return isinstance(layer, int) and _vision_model(tower) is not None


def blocks_needed(n_layers: int, feature_layer: int, upto: int = 0) -> int:
    """Blocks to run so that `hidden_states[feature_layer]` exists (hidden_states[0] is the embeddings'), and
    at least `upto` (a recorded block's index + 1)."""
    j = feature_layer if feature_layer >= 0 else n_layers + 1 + feature_layer
    if not 0 <= j <= n_layers:
        raise ValueError(f"vision_feature_layer {feature_layer} is outside a tower of {n_layers} blocks")
    return max(j, min(int(upto), n_layers))


@torch.no_grad()
def image_features(model, tower, pixels: torch.Tensor, *, feature_layer=None, strategy=None,
                   upto: int = 0) -> BaseModelOutputWithPooling:
    """What `model.model.get_image_features(pixel_values=pixels, return_dict=True)` returns, the tower run
    only up to the block its features come from (or `upto` blocks, when more are recorded):
    pooler_output: one (n, d) projected row block per image; hidden_states: a tuple as long as the full
    tower's (embeddings + every block), None but at the feature layer (what transformers keeps), so that
    `hidden_states[vision_feature_layer]` indexes it as the model does; last_hidden_state: the last block
    run's output."""
    cfg = model.config
    feature_layer = cfg.vision_feature_layer if feature_layer is None else feature_layer
    strategy = cfg.vision_feature_select_strategy if strategy is None else strategy
    vm = _vision_model(tower)
    layers = vm.encoder.layers
    n = blocks_needed(len(layers), int(feature_layer), upto)
    keep = feature_layer if feature_layer >= 0 else len(layers) + 1 + feature_layer
    hidden = vm.pre_layrnorm(vm.embeddings(pixels))
    states: list[torch.Tensor | None] = [None] * (len(layers) + 1)  # only the feature layer's is kept, as
    states[0] = hidden if keep == 0 else None                         # transformers' `select_hidden_states`
    for i, layer in enumerate(layers[:n], start=1):
        hidden = layer(hidden, None)
        if i == keep:
            states[i] = hidden
    selected = states[keep]
    if strategy == "default":
        selected = selected[:, 1:]
    feats = model.model.multi_modal_projector(selected)
    return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=list(feats), hidden_states=tuple(states))


__all__ = ["applies", "blocks_needed", "image_features"]
