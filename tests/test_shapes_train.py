"""Stage 1 of the embedded model's trainer with its options (pixel read-out, alignment cap, the
same-object spread loss, precision), on a tiny config for two steps: deterministic, the options
change the training, and the read-out head is not part of the model (the saved model is a plain
LLaVA either way)."""
import numpy as np
import torch

from mipruner.shapes import scenes as sc
from mipruner.shapes.model import TrainConfig, build_model, patch_targets, uses_bf16
from mipruner.shapes.train import stage1


def _tower_after(**options) -> dict[str, torch.Tensor]:
    options.setdefault("precision", "fp32")
    cfg = TrainConfig(vision_hidden=32, vision_layers=1, text_hidden=48, text_layers=1, heads=2, batch=2,
                      stage1_steps=2, warmup=1, **options)
    model = build_model(cfg)
    keys = set(model.state_dict())
    stage1(model, cfg, log=lambda msg: None)
    assert set(model.state_dict()) == keys, "stage 1 must not add parameters to the model"
    return {k: v.clone() for k, v in model.state_dict().items() if "vision_tower" in k or "projector" in k}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_stage1_options_are_deterministic_and_matter():
    torch.set_num_threads(1)
    plain = _tower_after(align_cap=0.0, spread_weight=0.0)  # alignment alone
    assert _same(plain, _tower_after(align_cap=0.0, spread_weight=0.0))
    both = _tower_after(recon_weight=1.0, align_cap=0.4, spread_weight=0.0)
    assert _same(both, _tower_after(recon_weight=1.0, align_cap=0.4, spread_weight=0.0))
    assert not _same(plain, both)
    assert not _same(both, _tower_after(recon_weight=1.0, align_cap=0.0, spread_weight=0.0))
    assert all(torch.isfinite(v).all() for v in both.values())


def test_spread_loss_is_deterministic_and_matters():
    torch.set_num_threads(1)
    plain = _tower_after(align_cap=0.4, spread_weight=0.0)
    spread = _tower_after(align_cap=0.4, spread_weight=10.0, spread_margin=0.0)
    assert _same(spread, _tower_after(align_cap=0.4, spread_weight=10.0, spread_margin=0.0))
    assert not _same(plain, spread)
    # a margin no cosine exceeds: the loss is zero and the training is the plain one
    assert _same(plain, _tower_after(align_cap=0.4, spread_weight=10.0, spread_margin=1.0))


def test_patch_owner_agrees_with_patch_labels():
    """The spread loss's object ids name the object whose colour and shape the patch is labelled with."""
    for index in range(6):
        scene = sc.make_scene(0, index)
        labels, obj = patch_targets(scene, 14, sc.PATCH_MIN_COVER)
        assert obj.shape == (196,) and obj.min() >= -1 and obj.max() < len(scene.objects)
        shown = obj >= 0
        assert ((labels[0] != -100) & (labels[0] < len(sc.COLORS)) == shown).all()
        for p in np.nonzero(shown)[0]:
            o = scene.objects[obj[p]]
            assert labels[0, p] == list(sc.COLORS).index(o.color) and labels[1, p] == sc.SHAPES.index(o.shape)


def test_precision_choices():
    assert not uses_bf16(TrainConfig(precision="fp32"))
    assert uses_bf16(TrainConfig(precision="bf16"))
    assert uses_bf16(TrainConfig(precision="auto")) == ("AVX512" in torch.backends.cpu.get_cpu_capability())
