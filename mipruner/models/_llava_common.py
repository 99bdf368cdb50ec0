"""What the three LLaVA families share: loading, prompt building, splicing kept tokens, generation,
vision-encoder attention capture, and the map from processed pixels back to the original image.

The family files (`llava_hf.py`, `llava_next.py`, `video_llava.py`) only say how to turn media into
processor inputs, visual tokens and their geometry. Everything that runs the LLM lives here:

  encode          media + prompt -> templated prompt -> input_ids with N_V visual placeholders;
                  visual tokens V from the model's public `get_image_features` / `get_video_features`;
                  text embeddings from `model.get_input_embeddings()`.
  prefill_logits  `inputs_embeds` = the prompt with the kept visual rows spliced in at the visual
  generate        placeholder positions (dropped ones removed: the sequence is N_V - K shorter),
                  then `model(inputs_embeds=..., attention_mask=..., position_ids=...)` or
                  `model.generate(...)`. Public inputs only; nothing is patched.

Positions (`positions=`): "compact" (default, as the peers and the paper do) numbers the pruned
sequence 0..L'-1; "original" keeps each token's position in the unpruned prompt, which makes the
pruned run equal to the unpruned one with the dropped tokens masked out of attention.

Attention: the vision tower is loaded with eager attention (the LLM keeps SDPA) through
transformers' per-sub-config `attn_implementation` dict, so that (a) the attention probabilities of
the feature layer can be read by a forward hook when a method asks, and (b) the visual tokens are
the same numbers whether or not attention was requested. CLIP at 577 tokens costs a few tens of MB
more in eager; pass `vision_attn="sdpa"` to trade attention capture for that memory.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..media import MediaError, Video, load_media
from ..pruners.selection import Selection, check_choice
from .base import Adapter, Answer, Encoded, LLMInputs, TokenGeometry, check_prompt, keep_indices
from .text import TEXT_MODES, text_mask

POSITIONS = ("compact", "original")


# ----------------------------------------------------------------------------------------------
# loading


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (what the checkpoints ship in); float32 on the CPU so that tests and the
    keep-all equality checks are not at the mercy of bf16 kernels. Pass dtype=torch.bfloat16
    on a CPU for speed (bf16 matmuls are about 4x faster than fp32 on the CPUs measured)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(model_cls, path: str, device, dtype, vision_attn: str = "eager"):
    """`model_cls.from_pretrained` with eager attention for the vision tower only (see module doc)."""
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype if dtype is not None else default_dtype(device)
    model = model_cls.from_pretrained(
        path, dtype=dtype, attn_implementation={"vision_config": vision_attn, "text_config": "sdpa"})
    return model.to(device).eval()


def chat_prompt(template_owner, prompt: str, kind: str, fallback: str, n_media: int = 1) -> str:
    """The user turn `[{type: kind} x n_media, {type: text}]` through the chat template, generation
    prompt on. `fallback` (with `{prompt}`) is used only when neither processor nor tokenizer has a
    template.
    """
    messages = [{"role": "user", "content": [{"type": kind}] * n_media + [{"type": "text", "text": prompt}]}]
    if getattr(template_owner, "chat_template", None):
        return template_owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return fallback.format(prompt=prompt)


# ----------------------------------------------------------------------------------------------
# geometry: processed pixels -> original pixels


def _size_get(size, key):
    if size is None:
        return None
    if isinstance(size, dict):
        return size.get(key)
    return getattr(size, key, None)


@dataclass
class PixelMap:
    """x_orig = (x_proc + crop_x) / scale_x - pad_x (same for y): undoes pad -> resize -> crop."""

    width: int  # original
    height: int
    pad_x: float = 0.0
    pad_y: float = 0.0
    scale_x: float = 1.0
    scale_y: float = 1.0
    crop_x: float = 0.0
    crop_y: float = 0.0

    def boxes(self, x0, y0, x1, y1) -> torch.Tensor:
        """(N, 4) original-pixel boxes of processed-pixel boxes, clipped to the image."""
        bx = (torch.as_tensor(x0, dtype=torch.float64), torch.as_tensor(x1, dtype=torch.float64))
        by = (torch.as_tensor(y0, dtype=torch.float64), torch.as_tensor(y1, dtype=torch.float64))
        xs = [((x + self.crop_x) / self.scale_x - self.pad_x).clamp(0, self.width) for x in bx]
        ys = [((y + self.crop_y) / self.scale_y - self.pad_y).clamp(0, self.height) for y in by]
        return torch.stack([xs[0], ys[0], xs[1], ys[1]], dim=-1).to(torch.float32)


def resize_crop_map(width: int, height: int, ip) -> PixelMap:
    """How a LLaVA-style image processor (pad-to-square? -> resize -> center crop?) moved pixels.

    Reads `do_pad`, `do_resize`, `size` (shortest_edge or height/width), `do_center_crop`,
    `crop_size` from the processor; the sizes are computed with transformers' own
    `get_resize_output_image_size`, so rounding matches the processor.
    """
    from transformers.image_transforms import get_resize_output_image_size

    m = PixelMap(width, height)
    w, h = width, height
    if getattr(ip, "do_pad", False) and getattr(ip, "pad_to_square", None) is not None and w != h:
        side = max(w, h)  # pad_to_square centres the image: start = (side - edge) // 2
        m.pad_x, m.pad_y = float((side - w) // 2), float((side - h) // 2)
        w = h = side
    if getattr(ip, "do_resize", True):
        size = ip.size
        short = _size_get(size, "shortest_edge")
        if short:
            dummy = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, h, w))  # no memory
            new_h, new_w = get_resize_output_image_size(dummy, size=short, default_to_square=False,
                                                        input_data_format="channels_first")
        else:
            new_h, new_w = _size_get(size, "height"), _size_get(size, "width")
        m.scale_x, m.scale_y = new_w / w, new_h / h
        w, h = new_w, new_h
    if getattr(ip, "do_center_crop", False):
        ch, cw = _size_get(ip.crop_size, "height"), _size_get(ip.crop_size, "width")
        # transformers' center_crop: top = (h - ch) // 2 when cropping, else pads by ceil((ch - h) / 2)
        m.crop_y = float((h - ch) // 2) if h >= ch else -float(-(-(ch - h) // 2))
        m.crop_x = float((w - cw) // 2) if w >= cw else -float(-(-(cw - w) // 2))
    return m


def grid_geometry(pmap: PixelMap, rows: int, cols: int, patch: int, frame: int = 0, kind: str = "patch"):
    """frame/row/col/box/kind for a rows x cols patch grid of `patch`-pixel processed patches."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = r.flatten(), c.flatten()  # row-major, the order the vision tower emits them
    box = pmap.boxes(c * patch, r * patch, (c + 1) * patch, (r + 1) * patch)  # (rows*cols, 4)
    return dict(frame=torch.full_like(r, frame), row=r, col=c, box=box, kind=[kind] * len(r))


def cat_geometry(parts: list[dict], grids, sizes) -> TokenGeometry:
    return TokenGeometry(frame=torch.cat([p["frame"] for p in parts]).long(),
                         row=torch.cat([p["row"] for p in parts]).long(),
                         col=torch.cat([p["col"] for p in parts]).long(),
                         box=torch.cat([p["box"] for p in parts]).float(),
                         kind=[k for p in parts for k in p["kind"]], grids=list(grids), sizes=list(sizes))


# ----------------------------------------------------------------------------------------------
# vision-encoder attention capture


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
    layer = encoder_layers(tower)[layer_index]
    attn = layer.self_attn
    out: dict[str, torch.Tensor] = {}

    def on_attn(_module, _inputs, output):
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError("the vision tower returned no attention probabilities: load the model with "
                               "vision_attn='eager' to capture attention")
        out["attention"] = weights.detach().float().mean(dim=1)  # (B, H, N+1, N+1) -> (B, N+1, N+1)

    def on_keys(_module, _inputs, output):
        b, n, _ = output.shape
        k = output.detach().float().view(b, n, attn.num_heads, attn.head_dim)  # (B, N+1, H, d_head)
        out["keys"] = k.mean(dim=2)  # (B, N+1, d_head)

    handles = [attn.register_forward_hook(on_attn), attn.k_proj.register_forward_hook(on_keys)]
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
    [CLS] key.
    """
    seen = view >= 0
    v = view.clamp_min(0)
    p = pos.clamp_min(0)
    n = int(view.numel())
    att = torch.zeros(n + 1, n + 1, dtype=att_all.dtype)
    att[0, 1:] = torch.where(seen, att_all[v, 0, p], torch.zeros(()))
    same = (view[:, None] == view[None, :]) & seen[:, None] & seen[None, :]  # (N_V, N_V)
    att[1:, 1:] = torch.where(same, att_all[v[:, None], p[:, None], p[None, :]], torch.zeros(()))
    keys = torch.zeros(n + 1, keys_all.shape[-1], dtype=keys_all.dtype)
    keys[0] = keys_all[0, 0]
    keys[1:] = torch.where(seen[:, None], keys_all[v, p], torch.zeros(()))
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


def _with_prefix(embeds: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor, vpos: torch.Tensor):
    """`prefix` (P, d) inserted right before the first visual token of the pruned sequence; each
    prefix row takes the first visual token's original position (used with positions="original")."""
    at = int((positions < vpos[0]).sum())  # the pruned sequence's index of the visual block
    pos = vpos[:1].to(positions.device).expand(prefix.shape[0])
    return (torch.cat([embeds[:at], prefix, embeds[at:]]), torch.cat([positions[:at], pos, positions[at:]]))


# ----------------------------------------------------------------------------------------------
# the shared adapter


class _Timer:
    """A LogitsProcessor that timestamps its first call: the end of the prefill forward."""

    def __init__(self):
        self.first: float | None = None

    def __call__(self, input_ids, scores):
        if self.first is None:
            if scores.is_cuda:
                torch.cuda.synchronize(scores.device)
            self.first = time.perf_counter()
        return scores


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LlavaFamilyAdapter(Adapter):
    """Shared body of the LLaVA adapters. Subclasses set `model_class_name` and implement
    `_inputs` (media + templated prompt -> processor-style inputs) and `_visual` (inputs ->
    visual tokens, geometry, frames, the vision tower, and how many images it ran on)."""

    model_class_name = ""
    default_frames = 8  # frames sampled from a video (Video-LLaVA)

    def __init__(self, model, processor, tokenizer, image_processor, *, name: str = "",
                 positions: str = "compact"):
        self.model = model
        self.processor = processor
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.name = name
        self.positions = check_choice("positions", positions, POSITIONS)
        self.config = model.config
        self.text_config = model.config.text_config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_positions = int(getattr(self.text_config, "max_position_embeddings", 0) or 0)

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def _load_processor(cls, path: str):
        """(processor, tokenizer, image_processor)."""
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(path)
        return proc, proc.tokenizer, proc.image_processor

    @classmethod
    def from_pretrained(cls, path: str, device=None, dtype=None, *, positions: str = "compact",
                        vision_attn: str = "eager", **kwargs) -> "LlavaFamilyAdapter":
        """Load model + processor from a directory or hub id.

        device: default cuda if available, else cpu. dtype: default bf16 on cuda, float32 on cpu.
        positions: "compact" | "original" (see module doc). vision_attn: "eager" (default; needed
        for attention capture) or "sdpa" for the vision tower; the LLM always uses SDPA.
        """
        import transformers

        check_choice("positions", positions, POSITIONS)
        model = load_model(getattr(transformers, cls.model_class_name), path, device, dtype, vision_attn)
        proc, tok, ip = cls._load_processor(path)
        return cls(model, proc, tok, ip, name=str(path), positions=positions, **kwargs)

    # -- family hooks --------------------------------------------------------------------------

    def _media(self, media):
        """PIL image(s) or Video from what the user gave (MediaError when unreadable)."""
        return load_media(media, num_frames=self.default_frames)

    def _encode_visual(self, media, templated: str, need_attention: bool) -> dict:
        """-> dict(input_ids (1, L), visual (N_V, d), geometry, frames, is_video, ref (plain-model
        inputs), attention/keys/has_cls/extra state)."""
        raise NotImplementedError

    # -- encode --------------------------------------------------------------------------------

    def _check_length(self, n: int) -> None:
        if self.max_positions and n > self.max_positions:
            raise ValueError(f"the prompt is too long: {n} tokens with the visual tokens, the model's "
                             f"context is {self.max_positions} (max_position_embeddings)")

    def _tokenize(self, text: str, **kw):
        return self.tokenizer(text, return_tensors="pt", **kw)

    @torch.no_grad()
    def encode(self, media, prompt: str, *, text_mode: str = "question", need_attention: bool = False) -> Encoded:
        check_prompt(prompt)
        check_choice("text_mode", text_mode, TEXT_MODES)
        t0 = time.perf_counter()
        media = self._media(media)
        kind = "video" if isinstance(media, Video) else "image"
        templated = self._template(prompt, kind, n_media=len(media.frames) if isinstance(media, Video)
                                   else len(media) if isinstance(media, list) else 1)
        # cheap length check before running the vision tower (text tokens alone)
        plain = self.tokenizer(templated, return_offsets_mapping=True)
        self._check_length(len(plain["input_ids"]))
        out = self._encode_visual(media, templated, need_attention)
        ids = out["input_ids"][0].to(self.device)  # (L,)
        self._check_length(int(ids.numel()))
        vis_mask = self._visual_mask(ids)  # (L,) bool
        n_v = int(vis_mask.sum())
        visual = out["visual"]
        if n_v != visual.shape[0]:
            raise RuntimeError(f"{n_v} visual placeholders in the prompt but {visual.shape[0]} visual tokens")
        embeds = self.model.get_input_embeddings()(ids[~vis_mask])  # (N_P, d)
        # token strings and offsets of the non-visual tokens, from the un-expanded templated prompt
        special = set(self._visual_token_ids())
        keep_tok = [i for i, t in enumerate(plain["input_ids"]) if t not in special]
        text_ids = [plain["input_ids"][i] for i in keep_tok]
        if text_ids != ids[~vis_mask].tolist():
            raise RuntimeError("the tokenizer and the processor disagree on the prompt's text tokens")
        offsets = [tuple(plain["offset_mapping"][i]) for i in keep_tok]
        tokens = self.tokenizer.convert_ids_to_tokens(text_ids)
        tmask = text_mask(tokens, offsets, templated, prompt, text_mode)
        _sync(self.device)
        state = dict(input_ids=ids, visual_positions=torch.nonzero(vis_mask).flatten(), ref=out.get("ref", {}),
                     templated=templated, **out.get("state", {}))
        return Encoded(model=self.name, prompt=prompt, visual=visual, geometry=out["geometry"], text=embeds,
                       text_tokens=tokens, text_mask=tmask, text_mode=text_mode, frames=out["frames"],
                       is_video=out.get("is_video", False), attention=out.get("attention"),
                       keys=out.get("keys"), has_cls=out.get("has_cls", False), cls=out.get("cls"), state=state,
                       timings={"encode_s": time.perf_counter() - t0})

    def _template(self, prompt: str, kind: str, n_media: int = 1) -> str:
        """`n_media` placeholders of `kind` before the prompt, through the chat template."""
        owner = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        fallback = "USER: " + f"<{kind}>\n" * n_media + "{prompt} ASSISTANT:"
        return chat_prompt(owner, prompt, kind, fallback=fallback, n_media=n_media)

    def _visual_token_ids(self) -> list[int]:
        ids = [getattr(self.config, "image_token_id", None), getattr(self.config, "video_token_id", None)]
        return [int(i) for i in ids if i is not None]

    def _visual_mask(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for t in self._visual_token_ids():
            mask |= ids == t
        return mask

    # -- pruned inputs -------------------------------------------------------------------------

    def pruned_inputs(self, encoded: Encoded, keep=None, positions: str | None = None) -> dict:
        """inputs_embeds (1, L', d), attention_mask (1, L'), position_ids (1, L') or None, and the
        original positions (L',) of the kept sequence. L' = L - (N_V - K). A Selection's `prefix`
        rows (VisionZip's [CLS]) go right before the first visual token and count in K."""
        positions = check_choice("positions", positions or self.positions, POSITIONS)
        idx = keep_indices(keep, encoded.n_visual, allow_prefix=True)
        st = encoded.state
        ids, vpos = st["input_ids"], st["visual_positions"]
        L, d = int(ids.numel()), encoded.visual.shape[-1]
        visual = encoded.visual
        if isinstance(keep, Selection) and keep.tokens is not None:
            if keep.tokens.shape != (keep.keep.numel(), d):
                raise ValueError(f"Selection.tokens must be (K, {d}) = {(keep.keep.numel(), d)}, "
                                 f"got {tuple(keep.tokens.shape)}")
            # tokens are in `keep` order; keep_indices sorts, so reorder by the sort of keep
            order = torch.argsort(keep.keep.to(torch.long).cpu())
            rows = keep.tokens[order].to(self.device, self.dtype)
        else:
            rows = visual if idx is None else visual[idx.to(visual.device)]
        text_pos = torch.ones(L, dtype=torch.bool, device=ids.device)
        text_pos[vpos] = False
        kept_vpos = vpos if idx is None else vpos[idx.to(vpos.device)]
        keep_pos = text_pos.clone()
        keep_pos[kept_vpos] = True
        orig_positions = torch.nonzero(keep_pos).flatten()  # (L',) ascending
        full = torch.empty(L, d, dtype=self.dtype, device=self.device)
        full[text_pos] = encoded.text.to(self.device, self.dtype)
        full[kept_vpos] = rows.to(self.device, self.dtype)
        embeds = full[orig_positions]  # (L', d)
        if isinstance(keep, Selection) and keep.prefix is not None:
            embeds, orig_positions = _with_prefix(embeds, orig_positions, keep.prefix.to(self.device, self.dtype),
                                                  vpos)
        embeds = embeds.unsqueeze(0)  # (1, L', d)
        mask = torch.ones(1, embeds.shape[1], dtype=torch.long, device=self.device)
        pos = orig_positions.unsqueeze(0) if positions == "original" else None
        return dict(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, orig_positions=orig_positions)

    @torch.no_grad()
    def prefill_logits(self, encoded: Encoded, keep=None, positions: str | None = None) -> torch.Tensor:
        """Logits (L', vocab) of one forward over the (pruned) prompt, float32 on the CPU."""
        p = self.pruned_inputs(encoded, keep, positions)
        kw = {} if p["position_ids"] is None else {"position_ids": p["position_ids"]}
        out = self.model(inputs_embeds=p["inputs_embeds"], attention_mask=p["attention_mask"], use_cache=False, **kw)
        return out.logits[0].float().cpu()

    def llm_inputs(self, encoded: Encoded) -> LLMInputs:
        """`inputs_embeds` = the spliced prompt with every visual token; positions 0..L-1 for the rotary
        embedding, the masks and the layers (what `LlamaModel` derives when none are passed)."""
        embeds = self.pruned_inputs(encoded, None)["inputs_embeds"]  # (1, L, d)
        pos = torch.arange(int(embeds.shape[1]), device=embeds.device).unsqueeze(0)  # (1, L)
        return LLMInputs(embeds=embeds, rope_positions=pos, layer_positions=pos,
                         visual_positions=encoded.state["visual_positions"].to(embeds.device),
                         next_position=int(embeds.shape[1]))

    @torch.no_grad()
    def generate(self, encoded: Encoded, keep=None, max_new_tokens: int = 64, positions: str | None = None,
                 **gen) -> Answer:
        """Greedy by default (`do_sample=False`); other `generate` kwargs pass through.

        prefill_s: from the call to the first logits (timestamped by a LogitsProcessor, i.e. after
        the prefill forward); decode_s: the rest.
        """
        from transformers import LogitsProcessorList

        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        p = self.pruned_inputs(encoded, keep, positions)
        timer = _Timer()
        gen = dict(gen)
        gen.setdefault("do_sample", False)
        procs = LogitsProcessorList(list(gen.pop("logits_processor", None) or []) + [timer])
        if self.tokenizer.pad_token_id is not None:
            gen.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        kw = {} if p["position_ids"] is None else {"position_ids": p["position_ids"]}
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.model.generate(inputs_embeds=p["inputs_embeds"], attention_mask=p["attention_mask"],
                                  max_new_tokens=int(max_new_tokens), logits_processor=procs, **kw, **gen)
        _sync(self.device)
        t1 = time.perf_counter()
        first = timer.first if timer.first is not None else t1
        ids = out[0].tolist()  # with inputs_embeds only, generate returns the new tokens only
        return Answer(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                      input_tokens=int(p["inputs_embeds"].shape[1]),
                      visual_tokens=int(p["inputs_embeds"].shape[1]) - int(encoded.text.shape[0]),
                      prefill_s=first - t0, decode_s=t1 - first)


def single_image(media, family: str):
    """One PIL image, else a MediaError naming what the family accepts."""
    from PIL import Image

    if isinstance(media, Image.Image):
        return media
    if isinstance(media, list) and len(media) == 1:
        return media[0]
    what = "a video" if isinstance(media, Video) else f"{len(media)} images"
    raise MediaError(f"{family} takes one image, got {what}")
