"""What every model adapter produces and accepts: `Encoded`, `TokenGeometry`, `Answer`, `Adapter`.

Data flow: `encode` once per (media, prompt) -> `Encoded`; any number of cheap `prune` calls on
`Encoded.visual` / `Encoded.scoring_text`; `generate(encoded, keep)` runs the LLM on the kept
visual tokens only, through the model's public inputs. `Adapter` is the whole contract: whatever
the in-LLM methods, the app, eval and the benches need from a model is one of its methods, so
nothing outside `mipruner/models/` tests a family or reads `Encoded.state`.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from PIL import Image

from ..pruners.selection import Selection
from ..pruners.signals import Signals, resolve_block
from ..pruners.video import token_frames
from .common.request import RequestState
from .common.state import Abilities


@dataclass
class TokenGeometry:
    """Where each of the N_V visual tokens comes from.

    frame: (N_V,) index of the image / video frame the token belongs to (0 for a single image).
    row, col: (N_V,) position in that frame's token grid (after any merge, e.g. Qwen's 2x2).
    box: (N_V, 4) float pixel box (x0, y0, x1, y1) in the ORIGINAL image/frame coordinates.
    kind: per-token label, e.g. "patch", "base" / "tile" (LLaVA-NeXT), "newline" (no box).
    grids: per frame (rows, cols) of the token grid; sizes: per frame (width, height) in pixels.
    """

    frame: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    box: torch.Tensor
    kind: list[str]
    grids: list[tuple[int, int]]
    sizes: list[tuple[int, int]]

    def __len__(self) -> int:
        return int(self.frame.numel())

    def grid(self) -> torch.Tensor:
        """(N_V, 3) int64 rows (view, row, col) on the geometry's device: a view is one (frame, kind) pair,
        numbered by frame, then kind in order of first appearance (an image, a frame, LLaVA-NeXT's base
        view or tiles, InternVL's tiles or thumbnail); tokens without a box ("newline") have view -1.
        What the downsampling baseline (`pool`) pools over."""
        kinds = {k: i for i, k in enumerate(dict.fromkeys(self.kind))}
        dev = self.frame.device
        code = torch.tensor([kinds[k] for k in self.kind], dtype=torch.long, device=dev)
        pair = self.frame.to(torch.long) * len(kinds) + code
        view = torch.unique(pair, return_inverse=True)[1]
        newline = torch.tensor([k == "newline" for k in self.kind], dtype=torch.bool, device=dev)
        view = torch.where(newline, torch.full_like(view, -1), view)
        return torch.stack([view, self.row.to(torch.long), self.col.to(torch.long)], 1)


class LazyGeometry(TokenGeometry):
    """A `TokenGeometry` built on its first read: an encoding computes where its tokens come from only when
    something asks (a drawing, an export, pool's grid, an evaluation's object masks), not on every encode.

    `build()` -> the TokenGeometry; called at most once, by the first access to any field. Pickling or
    copying builds it and gives a plain TokenGeometry."""

    def __init__(self, build: Callable[[], TokenGeometry]):  # noqa: the fields come from `build`, later
        self.__dict__["_build"] = build

    def __getattr__(self, name: str):  # only reached for an attribute not yet set: a field before the build
        build = self.__dict__.pop("_build", None)
        if build is None or name.startswith("__"):
            if build is not None:
                self.__dict__["_build"] = build
            raise AttributeError(name)
        geometry = build()
        for f in dataclasses.fields(TokenGeometry):
            self.__dict__[f.name] = getattr(geometry, f.name)
        return getattr(self, name)

    @property
    def built(self) -> bool:
        """Whether the geometry was computed (read) yet."""
        return "_build" not in self.__dict__

    def __reduce__(self):
        return TokenGeometry, tuple(getattr(self, f.name) for f in dataclasses.fields(TokenGeometry))


@dataclass
class Encoded:
    """One encoding of (media, prompt) by one model: everything pruning and rendering need.

    visual: (N_V, d) projected visual tokens, in LLM input order.
    text: (N_P, d) LLM input embeddings of the prompt's non-visual tokens, in order.
    text_tokens: the N_P token strings; text_mask (N_P,) bool marks those that count as "text"
    for scoring (see `mipruner.models.common.text`). `scoring_text` / `scoring_tokens` apply the mask.
    attention / keys: vision-encoder attention (head mean) and keys, only when asked for, in the form the attention
    pruners take: (N_V+1, N_V+1) with [CLS] first when the encoder has one (`has_cls`), else (N_V, N_V); keys
    (N_V[+1], d_head). LLaVA-1.5: the tower's own matrix; LLaVA-NeXT: all views, row 0 = each token's [CLS]
    attention in its view, 0 across views; Video-LLaVA video: block-diagonal over frames (each frame's [CLS] is a
    visual token there); Qwen: the ViT's attention pooled over each 2x2 merge group, no [CLS].
    cls: (P, d) the vision tower's [CLS] hidden state at the feature layer, through the projector (the LLM's input
    space), one row per view the tower saw (image, LLaVA-NeXT base view and tiles), filled with `attention` where the
    [CLS] is not itself a visual token; else None (Qwen has no [CLS]). VisionZip feeds it to the LLM as its original
    does (`Selection.prefix`). frames: the original images / frames (PIL), for drawing masks.
    features: (N_V, d_vision) the tower's hidden states that the projector reads, one row per visual token in LLM
    order, only when asked (`Signals.features`; per family: docs/plugins.md).
    blocks: {block: {"attention", "keys"[, "attention_heads"], "block"}} per encoder block asked for
    (`Signals.layers`, keyed by the block index asked, in [0, encoder_depth)); the same forms as `attention` /
    `keys`, "attention_heads" (H, ...) per head, "block" the block that gave them (Qwen2.5-VL moves a windowed block
    to a full-attention one). `signal(name, layer)` reads them.
    signals: what this encoding recorded; encoder_depth: the vision encoder's blocks; encoder_block: the default block
    (whose attention is `attention`), when attention was recorded.
    state: the adapter's typed per-request state (`common.request.RequestState`, a family's subclass: ids, positions,
    ...), read only under `mipruner/models/`; `prompt_tokens` is what others may read.
    An Encoded is treated as immutable once built (derived tensors are cached on it).
    """

    model: str
    prompt: str
    visual: torch.Tensor
    geometry: TokenGeometry
    text: torch.Tensor
    text_tokens: list[str]
    text_mask: torch.Tensor
    text_mode: str
    frames: list[Image.Image]
    is_video: bool = False
    attention: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    has_cls: bool = False
    cls: torch.Tensor | None = None
    state: "RequestState | None" = field(default=None, repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    features: torch.Tensor | None = None
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    signals: Signals = field(default_factory=Signals)
    encoder_depth: int = 0
    encoder_block: int | None = None

    @property
    def n_visual(self) -> int:
        return int(self.visual.shape[0])

    @property
    def prompt_tokens(self) -> int:
        """The unpruned prompt's length in tokens, visual tokens included (0 when the adapter keeps no state)."""
        return 0 if self.state is None else self.state.prompt_tokens

    def signal(self, name: str, layer: int | None = None) -> torch.Tensor | None:
        """Input `name` ("attention", "keys", "attention_heads") of encoder block `layer` (None: the default
        block), or None when this encoding did not record it; ValueError when the block does not exist."""
        if layer is None:
            if name != "attention_heads":
                return getattr(self, name)
            block = self.encoder_block
        else:
            block = resolve_block(layer, self.encoder_depth) if self.encoder_depth else None
        return self.blocks.get(block, {}).get(name)

    @functools.cached_property
    def scoring_text(self) -> torch.Tensor:
        """(N_T, d) embeddings of the tokens that count as text. Cached: one tensor per encoding,
        so per-encoding pruner caches (`cache=`) recognise it."""
        return self.text[self.text_mask]

    @functools.cached_property
    def grid(self) -> torch.Tensor:
        """(N_V, 3) (view, row, col) of each visual token (`TokenGeometry.grid`), the `grid=` input of `pool`."""
        return self.geometry.grid()

    @functools.cached_property
    def frame_index(self) -> torch.Tensor:
        """(N_V,) int64 video frame of each visual token, -1 for row newlines (`pruners.video.token_frames`), the
        `frame_index=` input of the video methods and of the per-frame option. Not a video (an image, whose
        views the geometry may number as frames, or several images): one frame, 0."""
        frame = self.geometry.frame
        return token_frames(frame if self.is_video else torch.zeros_like(frame), self.geometry.kind)

    @functools.cached_property
    def scoring_tokens(self) -> list[str]:
        return [t for t, m in zip(self.text_tokens, self.text_mask.tolist()) if m]


@dataclass
class Answer:
    """One generation: `text`, generated `token_ids` only, LLM input length, timings in seconds.

    An answer of a batched call (`mipruner.answer_batch`) carries the batch's `prefill_s` / `decode_s`,
    `batch_rows` (the rows that shared them) and `prefill_share` (its share of the prefill's compute);
    `mipruner.serve.answer_time.own_timing` gives what it may show as its own."""

    text: str
    token_ids: list[int]
    input_tokens: int
    visual_tokens: int
    prefill_s: float
    decode_s: float
    batch_rows: int = 1
    prefill_share: float = 1.0


def check_prompt(prompt: Any) -> str:
    """The prompt itself, or ValueError when it is not a non-blank string (every adapter's rule)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt is empty: ask a question about the image or video")
    return prompt


def keep_indices(keep: None | torch.Tensor | Selection | list[int], n_visual: int, *,
                 allow_prefix: bool = False) -> torch.Tensor | None:
    """Normalise `keep` to a sorted unique LongTensor on the CPU (None = keep all).

    Out-of-range, duplicate or empty indices raise ValueError; so does a Selection with `prefix`
    rows unless the caller feeds them (allow_prefix=True), so that they are never dropped silently.
    """
    if keep is None:
        return None
    if isinstance(keep, Selection):
        if keep.prefix is not None and not allow_prefix:
            raise ValueError("the selection carries prefix rows (Selection.prefix, VisionZip's [CLS]) that this "
                             "model path cannot feed; select without them (no `cls` input)")
        keep = keep.keep
    keep = (keep if isinstance(keep, torch.Tensor) else torch.as_tensor(keep, device="cpu")).flatten()
    if keep.dtype.is_floating_point or keep.dtype == torch.bool:
        raise ValueError(f"keep must hold integer indices, got dtype {keep.dtype}")
    keep = keep.to(torch.long).cpu()
    if keep.numel() == 0:
        raise ValueError("keep is empty: keep at least one visual token")
    if int(keep.min()) < 0 or int(keep.max()) >= n_visual:
        raise ValueError(f"keep indices must be in [0, {n_visual - 1}], got range "
                         f"[{int(keep.min())}, {int(keep.max())}]")
    uniq = torch.unique(keep)  # sorted
    if uniq.numel() != keep.numel():
        raise ValueError("keep has duplicate indices")
    return uniq


@dataclass
class LLMInputs:
    """The unpruned LLM input of one encoding, as the model's own forward builds it (batch size 1).

    embeds: (1, L, d) input embeddings of the full prompt (visual rows included).
    rope_positions: (1, L) or (3, 1, L) (M-RoPE) positions fed to the decoder's rotary embedding.
    layer_positions: (1, L) position ids the layers and the mask builder see, or None (Qwen: the
        text model passes none for 3-row positions).
    visual_positions: (N_V,) sequence index of each visual token, ascending.
    next_position: the position of the first generated token.
    deepstack: Qwen3-VL only: per injected layer i, (N_V, d) added to the visual rows after layer i.
    """

    embeds: torch.Tensor
    rope_positions: torch.Tensor
    layer_positions: torch.Tensor | None
    visual_positions: torch.Tensor
    next_position: int
    deepstack: list[torch.Tensor] | None = None


class Adapter(abc.ABC):
    """One model family behind three methods (lmms-eval's small-backend pattern).

    Subclasses set `family` and implement `from_pretrained`, `encode`, `prefill_logits`,
    `generate`. They never patch transformers classes: pruning goes through public inputs
    (`inputs_embeds`, `position_ids`, ...) and any hook is removed before returning.
    """

    family: str = ""
    abilities: Abilities = Abilities()  # declared per class (`Abilities`); read, never probed
    # `encode(views=...)`: "all" views of an image; anyres families add "base" (`common.views.check_views`)
    view_modes: tuple[str, ...] = ("all",)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for name in ("batch_decoding", "batch_encoding"):
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__} sets `{name}`: declare it as `abilities = Abilities({name}=...)`")
        if not isinstance(cls.abilities, Abilities):
            raise TypeError(f"{cls.__name__}.abilities must be an Abilities, got {type(cls.abilities).__name__}")

    batch_decoding = property(lambda self: self.abilities.batch_decoding)  # read-only, from `abilities`
    batch_encoding = property(lambda self: self.abilities.batch_encoding)

    @functools.cached_property
    def decode_state(self):
        """This adapter's decoding state (`common.state.DecodeState`: the path, the declared buckets,
        compiled functions, static caches, the compiled path's shapes), made on first use."""
        from .common.state import DecodeState

        return DecodeState()

    @property
    def decoder(self):
        """The decoding engine of this adapter's model (`common.decode.DecodeEngine`), handed `decode_state`."""
        from .common.decode import DecodeEngine

        return DecodeEngine(self.model, self.decode_state)

    @property
    def decode_path(self):
        """The decoding path (`common.path.DecodePath`; plain by default) in `decode_state`: `use_decode_path`."""
        return self.decode_state.path

    def use_decode_path(self, *, bucket: int = 0, static_cache: bool = False, compile: bool = False,
                        buckets=None) -> "Adapter":
        """Answer on this decoding path from now on (`mipruner/models/common/path.py`): all zero/False is the
        plain path (the default); e.g. `bucket=64, static_cache=True` for the GPU path. `buckets`: the shapes
        that compile (`common.state.Buckets`; others run eagerly; None: each on its first use). Only an adapter
        whose `abilities` declare `batch_decoding` has another path (ValueError). Returns the adapter."""
        if not self.abilities.batch_decoding and not (bucket == 0 and not static_cache and not compile):
            raise ValueError(f"the {self.family or type(self).__name__!r} adapter has no "
                             "batched decoder: it only decodes on the plain path")
        self.decode_state.choose(bucket=bucket, static_cache=static_cache, compile=compile, buckets=buckets)
        return self

    @classmethod
    @abc.abstractmethod
    def from_pretrained(cls, path: str, device: str | torch.device | None = None,
                        dtype: torch.dtype | None = None, **kwargs) -> "Adapter":
        ...

    def read_media(self, media: Any) -> Any:
        """`media` as `encode` reads it (a video file: a `Video`), taken by `encode` as is; default: itself."""
        return media

    @abc.abstractmethod
    def encode(self, media: Any, prompt: str, *, text_mode: str = "question",
               need_attention: bool = False, signals: Signals | None = None) -> Encoded:
        """need_attention: the default block's attention, keys and [CLS]; signals: more of the vision
        encoder (`Signals`: other blocks, per-head attention, pre-projector features), recorded in the
        same tower pass. Adapters written before signals may omit `signals` (`encode_kwargs`)."""

    @abc.abstractmethod
    def prefill_logits(self, encoded: Encoded, keep=None) -> torch.Tensor:
        """Logits (L, vocab) of one forward pass over the (pruned) prompt, float32 on the CPU."""

    @abc.abstractmethod
    def generate(self, encoded: Encoded, keep=None, max_new_tokens: int | None = None, *, config=None,
                 logits_processor=None, **gen) -> Answer:
        """Greedy answer on the kept tokens. `config`: a `common.generation.GenerationConfig` validated where
        the request entered, or its fields as keywords; `logits_processor`: callables (ids, scores) -> scores."""

    # -- what the in-LLM methods, the app and the benches need (defaults for transformers models) --

    def text_decoder(self):
        """The language model's decoder: a module with public `embed_tokens`, `rotary_emb`, `layers`
        and `norm`, which the in-LLM methods run layer by layer. NotImplementedError when the
        adapter has no transformers decoder (e.g. the dummy adapter)."""
        lm = getattr(getattr(getattr(self, "model", None), "model", None), "language_model", None)
        if lm is None:
            raise NotImplementedError(f"the {self.family or type(self).__name__!r} adapter has no text decoder")
        for name in ("embed_tokens", "rotary_emb", "layers", "norm"):
            if not hasattr(lm, name):
                raise NotImplementedError(f"the text decoder {type(lm).__name__} has no `{name}`: cannot drive it")
        return lm

    def output_head(self):
        """The output projection (hidden states -> vocabulary logits)."""
        return self.model.get_output_embeddings()

    @property
    def n_layers(self) -> int:
        """Decoder layers of the language model (an in-LLM method's K lies in [1, n_layers]); 0 if none."""
        try:
            return len(self.text_decoder().layers)
        except NotImplementedError:
            return 0

    def llm_inputs(self, encoded: Encoded) -> LLMInputs:
        """The unpruned LLM input of `encoded`, value for value what the model's forward builds."""
        raise NotImplementedError(f"the {self.family or type(self).__name__!r} adapter cannot expose its LLM input")

    def fixed_length_kwargs(self, n: int) -> dict:
        """`generate` keyword arguments that make it decode exactly `n` tokens (EOS masked; benchmarks)."""
        return {"min_new_tokens": n}
