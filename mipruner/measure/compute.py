"""The compute a selection implies in the language model's prefill, from the LLM's config and the rows
each decoder layer processes (the formula is written out in docs/methods.md, "Compute").

For a decoder of width d, FFN width I (gated: three matrices), H query heads and KV key/value heads of
width d_h, vocabulary V and n_l rows entering layer l:

    F(n)       = 4 n d H d_h  +  4 n d KV d_h  +  4 n^2 H d_h  +  6 n d I
                 (q and o)       (k and v)        (q k^T and p v)  (gate, up, down)
    FLOPs      = sum_l F(n_l) + 2 d V          (the output head on the last row, which greedy reads)
    visual-token-layers = sum_l v_l            (v_l: visual rows, merged ones included, in layer l)
    KV bytes   = sum_l 2 n_l KV d_h b          (b: bytes per value of the model's dtype)

Decoding (`decode_compute`, an answer's): each step runs one row through every layer against the keys the
layer holds (the text, its visual rows, the tokens generated), and a decode-time stage's masked keys are
not read: step s, layer l costs 4 d H d_h + 4 d KV d_h + 6 d I + 4 (N_T + v_l,s + s) H d_h, plus the head.

Rows: a pre-LLM selection sends N_T + K rows through every layer (K = `Selection.budget`, merged and
`prefix` rows counted); an in-LLM selection sends the full prompt through the layers before its first
stage, then each stage's rows from its layer on (none visual once a stage withdraws them all); the
unpruned model N_T + N_V everywhere. Each figure also as a share of the unpruned one. Counted: the
matrix products (a multiply-add = 2 FLOPs, attention over every key, as FastV's paper counts); not
counted: norms, rotary, softmax, the embedding look-up, sliding windows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LLMShape:
    """What the formula reads of a decoder: d, I, depth, H, KV, d_h, V and bytes per value."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    value_bytes: int = 2

    @classmethod
    def from_config(cls, config, *, layers: int | None = None, vocab: int | None = None,
                    value_bytes: int = 2) -> "LLMShape":
        """From a transformers text config (hidden_size, intermediate_size, num_hidden_layers,
        num_attention_heads, num_key_value_heads, head_dim, vocab_size)."""
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        return cls(hidden=int(config.hidden_size), intermediate=int(config.intermediate_size),
                   layers=int(layers if layers is not None else config.num_hidden_layers), heads=heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
                   vocab=int(vocab if vocab is not None else config.vocab_size), value_bytes=int(value_bytes))

    @classmethod
    def of(cls, config, value_bytes: int = 2) -> "LLMShape":
        """From a multimodal config (its `text_config`) or a text config itself."""
        return cls.from_config(getattr(config, "text_config", None) or config, value_bytes=value_bytes)

    def layer_weights(self) -> int:
        """Weights of one decoder layer's matrix products (q, k, v, o; gate, up, down)."""
        d, dh = self.hidden, self.head_dim
        return 2 * d * self.heads * dh + 2 * d * self.kv_heads * dh + 3 * d * self.intermediate

    def row_flops(self, n: int) -> int:
        """One row of n tokens through every layer and the output head (0 for an empty row)."""
        if n < 0:
            raise ValueError(f"a row has at least 0 tokens, got {n}")
        return self.prefill_flops([n] * self.layers) if n else 0

    def layer_flops(self, n: int) -> int:
        """F(n): one decoder layer on n rows attending to those n rows."""
        d, dh = self.hidden, self.head_dim
        return 4 * n * d * self.heads * dh + 4 * n * d * self.kv_heads * dh + 4 * n * n * self.heads * dh \
            + 6 * n * d * self.intermediate

    def prefill_flops(self, rows: list[int]) -> int:
        """sum_l F(n_l) + 2 d V for rows n_l per layer."""
        return sum(self.layer_flops(n) for n in rows) + 2 * self.hidden * self.vocab

    def kv_bytes(self, rows: list[int]) -> int:
        return sum(2 * n * self.kv_heads * self.head_dim * self.value_bytes for n in rows)


@dataclass(frozen=True)
class Compute:
    """A selection's prefill compute and its share of the unpruned model's (share = value / unpruned)."""

    flops: int
    flops_share: float
    visual_token_layers: int
    visual_token_layers_share: float
    kv_bytes: int
    kv_share: float
    visual_rows: tuple[int, ...]  # visual rows entering each layer

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """One line for a panel: "prefill 1.23 TFLOPs (41% of unpruned) · visual-token-layers 30% · KV cache 45%"."""
        return (f"prefill {_si(self.flops)}FLOPs ({100 * self.flops_share:.0f}% of unpruned) · "
                f"visual-token-layers {self.visual_token_layers} ({100 * self.visual_token_layers_share:.0f}%) · "
                f"KV cache {_si(self.kv_bytes)}B ({100 * self.kv_share:.0f}%)")


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def visual_rows(n_layers: int, n_text: int, n_visual: int, selection) -> list[int]:
    """Visual rows entering each decoder layer under `selection` (None: unpruned): a staged in-LLM
    selection's per stage (`extras["stages"]`), any other's `budget` at every layer."""
    if selection is None:
        return [n_visual] * n_layers
    stages = selection.extras.get("stages") if isinstance(selection.extras, dict) else None
    if not stages:
        return [int(selection.budget)] * n_layers
    out, current = [], n_visual
    bounds = {int(s.layer): int(s.rows.numel()) - n_text for s in stages}
    for layer in range(n_layers):
        current = bounds.get(layer, current)
        out.append(current)
    return out


def compute_of(shape: LLMShape, n_text: int, n_visual: int, selection) -> Compute:
    """The compute of `selection` (None: unpruned) on a prompt of n_text + n_visual rows."""
    vis = visual_rows(shape.layers, n_text, n_visual, selection)
    rows = [n_text + v for v in vis]
    full = [n_text + n_visual] * shape.layers
    f, f0 = shape.prefill_flops(rows), shape.prefill_flops(full)
    kv, kv0 = shape.kv_bytes(rows), shape.kv_bytes(full)
    vtl, vtl0 = sum(vis), n_visual * shape.layers
    return Compute(f, f / f0, vtl, vtl / vtl0 if vtl0 else 1.0, kv, kv / kv0, tuple(vis))


@dataclass(frozen=True)
class DecodeCompute:
    """An answer's decoding compute (`decode_compute`) and its share of the unpruned decoding's."""

    steps: int
    flops: int
    flops_share: float
    visual_keys: int
    visual_keys_share: float

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """One line: "decode 12 steps 3.4 GFLOPs (62% of unpruned) · visual keys read 40%"."""
        return (f"decode {self.steps} steps {_si(self.flops)}FLOPs ({100 * self.flops_share:.0f}% of unpruned) · "
                f"visual keys read {self.visual_keys} ({100 * self.visual_keys_share:.0f}%)")


def _decode_counts(shape: LLMShape, n_text: int, vis_layers: list[int], per_step, steps: int):
    d, dh = shape.hidden, shape.head_dim
    row = 4 * d * shape.heads * dh + 4 * d * shape.kv_heads * dh + 6 * d * shape.intermediate
    flops = keys_read = 0
    for s in range(1, steps + 1):
        for layer in range(shape.layers):
            v = per_step(s, layer, vis_layers[layer])
            flops += row + 4 * (n_text + v + s) * shape.heads * dh
            keys_read += v
        flops += 2 * d * shape.vocab
    return flops, keys_read


def decode_compute(shape: LLMShape, n_text: int, n_visual: int, selection, answer) -> DecodeCompute:
    """The decoding compute of `answer` (its len(token_ids) - 1 steps that run the decoder) under `selection`
    (None: unpruned). Step s, layer l reads the keys of the text, the visual rows the layer holds and the s
    tokens generated: F_step = 4 d H d_h + 4 d KV d_h + 6 d I + 4 (N_T + v + s) H d_h, plus the head 2 d V. A
    decode-time stage (`extras["decode"]`) sets v at its layers from the answer's `decode_visual`."""
    steps = max(0, len(answer.token_ids) - 1)
    vis = visual_rows(shape.layers, n_text, n_visual, selection)
    stage = selection.extras.get("decode") if selection is not None and isinstance(selection.extras, dict) else None
    attended = tuple(getattr(answer, "decode_visual", ()) or ())

    def ours(s, layer, v):
        if stage is not None and layer >= int(stage.layer) and s - 1 < len(attended):
            return int(attended[s - 1])
        return v

    f, k = _decode_counts(shape, n_text, vis, ours, steps)
    f0, k0 = _decode_counts(shape, n_text, [n_visual] * shape.layers, lambda s, layer, v: v, steps)
    return DecodeCompute(steps, f, f / f0 if f0 else 1.0, k, k / k0 if k0 else 1.0)


def adapter_shape(adapter) -> LLMShape | None:
    """The LLMShape of an adapter's language model (its text decoder's config, depth and output
    head; the dtype of its weights), or None when it has no transformers decoder (the dummy adapter)."""
    try:
        lm = adapter.text_decoder()
    except (NotImplementedError, AttributeError):
        return None
    head = adapter.output_head()
    weight = next(lm.parameters())
    shape = LLMShape.from_config(lm.config, layers=len(lm.layers), vocab=int(head.weight.shape[0]),
                                 value_bytes=weight.element_size())
    return shape


def selection_compute(adapter, encoded, selection) -> Compute | None:
    """`compute_of` for a selection of `encoded` by `adapter` (None: unpruned); None without a decoder."""
    shape = adapter_shape(adapter) if adapter is not None else None
    if shape is None:
        return None
    n_text = int(encoded.text.shape[0])
    return compute_of(shape, n_text, int(encoded.n_visual), selection)


def attach_compute(adapter, encoded, selection):
    """`selection` with `extras["compute"]` set (`selection_compute`) when the adapter has a decoder."""
    c = selection_compute(adapter, encoded, selection)
    if c is not None:
        selection.extras["compute"] = c
    return selection


__all__ = ["attach_compute", "Compute", "DecodeCompute", "decode_compute", "LLMShape", "adapter_shape", "compute_of", "selection_compute", "visual_rows"]
