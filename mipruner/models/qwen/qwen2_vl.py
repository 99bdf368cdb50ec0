"""Qwen2-VL and Qwen2.5-VL adapter (Qwen3-VL subclasses it in `qwen3_vl.py`).

How pruning reaches the model, through public inputs only:
  * the visual tokens come from `model.get_image_features` / `get_video_features`;
  * the M-RoPE 3-D positions are computed ONCE on the full, unpruned sequence with the model's
    public `model.model.get_rope_index`, and the kept columns are gathered (as every Qwen port does);
  * the LLM runs on `input_ids` with the dropped placeholder tokens removed, the kept visual rows
    passed as `mm_encoder_outputs` (the model scatters them into the remaining placeholders), and
    `position_ids` passed explicitly, so `get_rope_index` is never re-run on the pruned sequence;
  * decoding is the decoding engine's greedy loop (`common/decode.DecodeEngine`; one answer is a
    batch of one, `batch.py`) over `past_key_values` with explicit positions that continue from the
    UNPRUNED max position + 1 (rope_deltas as for the unpruned length). `generate()` is not used
    because it recomputes positions from the (pruned) input ids and keeps `rope_deltas` as hidden
    model state; with keep=None the engine gives the same tokens as `model.generate`.

Preprocessing does not need torchvision: hub checkpoints carry a video processor config whose
processor class imports torchvision, so `AutoProcessor` fails here. We build the inputs from the
tokenizer and the PIL image processor; images are read as transformers reads them
(`mipruner.media.load_image`), videos as its video processors do (`video.py`: settings, which
frames, resize target and patch layout, with the deviations listed there).
"""
from __future__ import annotations

import time

import torch
from PIL import Image

from ...pruners.selection import Selection
from . import attention as QA, encode_batch as QE, video as QV
from .attention import merge_attention
from .video import read_json, smart_resize
from ..base import Abilities, Adapter, Answer, Encoded, LLMInputs, TokenGeometry, check_prompt, keep_indices
from ..common.generation import GenerationConfig, processors
from ..common.request import QwenState
from ...pruners.signals import Signals
from ..common.text import text_mask


class Qwen2VLAdapter(Adapter):
    """Qwen2-VL / Qwen2.5-VL behind `encode` / `prefill_logits` / `generate`."""

    family = "qwen2_vl"
    qwen3 = False  # which official video processor the settings and rules follow
    attention_layer = -2  # ViT block whose attention `need_attention` returns (VisionZip's L-2)
    # `generate_batch`: the decoding engine; `encode_batch`: the single images of a batch in one tower call
    abilities = Abilities(batch_decoding=True, batch_encoding=True)
    device = property(lambda self: self.model.device)  # where the model runs

    def __init__(self, model, tokenizer, image_processor, video_config: dict, name: str = ""):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.config = model.config
        self.name = name or getattr(self.config, "_name_or_path", "")
        vc = self.config.vision_config
        self.patch = int(vc.patch_size)
        self.merge = int(vc.spatial_merge_size)
        self.temporal = int(vc.temporal_patch_size)
        self.image_token = tokenizer.convert_ids_to_tokens(self.config.image_token_id)
        self.video_token = tokenizer.convert_ids_to_tokens(self.config.video_token_id)
        self.video_config = QV.video_settings(video_config, qwen3=self.qwen3)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str, device=None, dtype=None, **kwargs) -> "Qwen2VLAdapter":
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype or torch.float32, **kwargs)
        if device is not None:
            model = model.to(device)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(tokenizer, "chat_template", None):
            template = read_json(path, "chat_template.json").get("chat_template")
            if template:
                tokenizer.chat_template = template
        # The PIL image processor everywhere (also where torchvision exists), so pixels match.
        image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
        if cls is Qwen2VLAdapter and model.config.model_type == "qwen2_5_vl":
            cls = Qwen2_5_VLAdapter  # the family table maps both types to this class
        return cls(model, tokenizer, image_processor, QV.video_processor_dict(path), name=path)

    # ------------------------------------------------------------------ media
    def sample_frames(self, total: int, video_fps: float) -> list[int]:
        """Frame indices the official video processor reads from a `total`-frame video."""
        return QV.qwen2_indices(total, video_fps, self.video_config)

    def _read_media(self, media):
        """(frames, is_video, sampled frame indices, video fps (0 = unknown), frames in the stream): `video.read_media`."""
        return QV.read_media(media, self.sample_frames)

    def read_media(self, media):
        """A video file's sampled frames as a `Video` (what `_read_media` reads of it), an image file opened."""
        return QV.decoded(media, self.sample_frames)

    def video_resize_target(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """(height, width) of every frame of a `num_frames`-frame video (the real count, not padded)."""
        return QV.resize_target(num_frames, height, width, self.video_config, self.patch * self.merge,
                                self.temporal, qwen3=self.qwen3)

    def _video_pixels(self, frames: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """Frames -> (pixel_values_videos, video_grid_thw (1, 3), (resized h, w))."""
        w, h = frames[0].size
        target = self.video_resize_target(len(frames), h, w)
        pixels, grid = QV.video_pixels(frames, target, self.video_config, self.image_processor, self.patch,
                                       self.merge, self.temporal)
        return pixels, grid, target

    def _expand_video_text(self, text: str, grid: torch.Tensor, indices: list[int], fps: float) -> str:
        n = int(grid.prod()) // self.merge ** 2
        return text.replace(self.video_token, self.video_token * n, 1)

    def _video_rope_kwargs(self, indices: list[int], fps: float, total: int) -> dict:
        """Extra `get_rope_index` inputs for videos (Qwen2.5-VL: seconds per temporal patch)."""
        return {}

    # ------------------------------------------------------------------ encode
    @property
    def max_positions(self) -> int:
        """The model's context in positions (max_position_embeddings)."""
        return int(self.config.text_config.max_position_embeddings)

    def encode(self, media, prompt: str, *, text_mode: str = "question", need_attention: bool = False,
               signals: Signals | None = None) -> Encoded:
        return self._encode(media, prompt, text_mode=text_mode, need_attention=need_attention, signals=signals)

    @torch.no_grad()
    def _encode(self, media, prompt: str, *, text_mode: str, need_attention: bool, signals: Signals | None,
                held=None) -> Encoded:
        """`encode`; `held`: this item's share of a batched tower call (`encode_batch`), or None."""
        check_prompt(prompt)
        want = Signals.of(need_attention, signals)
        t0 = time.perf_counter()
        frames, is_video, indices, fps, total = self._read_media(media)
        kind = "video" if is_video else "image"
        messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": prompt}]}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rope_kwargs = {}
        if is_video:
            pixels, grid, (rh, rw) = self._video_pixels(frames)
            text = self._expand_video_text(text, grid, indices, fps)
            vision = {"pixel_values_videos": pixels, "video_grid_thw": grid}
            rope_kwargs = self._video_rope_kwargs(indices, fps, total)
        else:  # a batched tower call's share (`encode_batch`) holds this item's processor output and features
            out = held[0] if held else self.image_processor(images=frames, return_tensors="pt")
            grid = out["image_grid_thw"]
            rh, rw = int(grid[0, 1]) * self.patch, int(grid[0, 2]) * self.patch
            text = text.replace(self.image_token, self.image_token * (int(grid.prod()) // self.merge ** 2), 1)
            vision = {"pixel_values": out["pixel_values"], "image_grid_thw": grid}
        enc = self.tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
        ids = enc["input_ids"]  # (1, L)
        if ids.shape[1] > self.max_positions:
            raise ValueError(f"prompt too long: {ids.shape[1]} tokens with the visual tokens, the model's "
                             f"context is {self.max_positions}")
        token_id = self.config.video_token_id if is_video else self.config.image_token_id
        mm_types = torch.zeros_like(ids, dtype=torch.int32)
        mm_types[ids == self.config.image_token_id] = 1
        mm_types[ids == self.config.video_token_id] = 2
        device = self.model.device
        vision = {k: v.to(device) for k, v in vision.items()}
        positions, rope_deltas = self.model.model.get_rope_index(
            ids.to(device), mm_token_type_ids=mm_types.to(device),
            image_grid_thw=vision.get("image_grid_thw"), video_grid_thw=vision.get("video_grid_thw"),
            **{k: v.to(device) for k, v in rope_kwargs.items()})  # (3, 1, L), (1, 1)
        t1 = time.perf_counter()
        store: dict = {}
        with QA.record(self, vision, store, want):
            if not is_video and held:
                feats = held[1]
            elif is_video:
                feats = self.model.get_video_features(vision["pixel_values_videos"], vision["video_grid_thw"],
                                                      return_dict=True)
            else:
                feats = self.model.get_image_features(vision["pixel_values"], vision["image_grid_thw"],
                                                      return_dict=True)
        visual = torch.cat(feats.pooler_output, dim=0)  # (N_V, d)
        t2 = time.perf_counter()

        vis_pos = (ids[0] == token_id).nonzero().flatten()  # (N_V,) sequence positions
        if vis_pos.numel() != visual.shape[0]:
            raise RuntimeError(f"{vis_pos.numel()} placeholder tokens for {visual.shape[0]} visual tokens")
        text_pos = ((ids[0] != self.config.image_token_id) & (ids[0] != self.config.video_token_id)).nonzero().flatten()
        text_ids = ids[0, text_pos]
        text_emb = self.model.get_input_embeddings()(text_ids.to(device))  # (N_P, d)
        offsets = [tuple(o) for o in enc["offset_mapping"][0, text_pos].tolist()]
        tokens = self.tokenizer.convert_ids_to_tokens(text_ids.tolist())
        geometry, shown = self._geometry(grid, frames, (rh, rw), is_video)

        state = QwenState(input_ids=ids, mm_token_type_ids=mm_types, positions=positions.cpu(),
                          rope_deltas=rope_deltas.cpu(), visual_positions=vis_pos, modality=kind,
                          vision_inputs={k: v.cpu() for k, v in vision.items()}, rope_kwargs=rope_kwargs,
                          templated=text, sampled_frames=frames, frame_indices=indices)
        if is_video:
            # token-frame t -> its T sampled frames (the last one repeated where the video was padded)
            state.frame_groups = [[min(i + j, len(frames) - 1) for j in range(self.temporal)]
                                  for i in range(0, len(frames), self.temporal)]
        self._extra_state(feats, state)
        return Encoded(
            model=self.name, prompt=prompt, visual=visual.detach(), geometry=geometry, text=text_emb.detach(),
            text_tokens=tokens, text_mask=text_mask(tokens, offsets, text, prompt, text_mode),
            text_mode=text_mode, frames=shown, is_video=is_video, attention=store.get("attention"),
            keys=store.get("keys"), has_cls=False, state=state,
            timings={"preprocess_s": t1 - t0, "vision_s": t2 - t1, "encode_s": time.perf_counter() - t0},
            **QA.signal_fields(self, want, store, grid))

    def encode_batch(self, items, **kw) -> list[Encoded]:
        """`encode` of several (media, prompt) items, the single images in ONE tower call (`encode_batch.py`)."""
        return QE.encode_batch(self, items, **kw)

    def _extra_state(self, feats, state: QwenState) -> None:
        """Family-specific outputs of the feature method to keep (Qwen3-VL: deepstack)."""

    def _geometry(self, grid: torch.Tensor, frames, resized: tuple[int, int], is_video: bool):
        """Token grid after the m x m merge, boxes in original pixels; one shown frame per token-frame."""
        grid_t, gh, gw = (int(x) for x in grid[0])
        rows, cols = gh // self.merge, gw // self.merge
        w, h = frames[0].size
        rh, rw = resized
        sx, sy = w / rw, h / rh
        cell = self.patch * self.merge
        r = torch.arange(rows).repeat_interleave(cols).repeat(grid_t)
        c = torch.arange(cols).repeat(rows).repeat(grid_t)
        f = torch.arange(grid_t).repeat_interleave(rows * cols)
        box = torch.stack([c * cell * sx, r * cell * sy, (c + 1) * cell * sx, (r + 1) * cell * sy], 1).float()
        # token-frame t covers sampled frames [t*T, (t+1)*T): show the first of them
        shown = [frames[i] for i in range(0, len(frames), self.temporal)] if is_video else list(frames)
        geometry = TokenGeometry(frame=f, row=r, col=c, box=box, kind=["patch"] * int(f.numel()),
                                 grids=[(rows, cols)] * grid_t, sizes=[(w, h)] * grid_t)
        return geometry, shown

    # ------------------------------------------------------------------ vision attention
    def _attention_block(self, target: int | None = None) -> int:  # the block giving `target`'s attention
        depth = len(self.model.model.visual.blocks)
        return self.attention_layer % depth if target is None else target

    def _attention_order(self, grid: torch.Tensor):
        """Token order inside the ViT blocks relative to the LLM order (None = the same)."""
        return None

    def _attention_capture(self, vision: dict, store: dict, enabled: bool, blocks: dict | None = None):
        """A context that captures ViT blocks' attention (see `attention.capture`)."""
        return QA.capture(self, vision, store, enabled, blocks)

    # ------------------------------------------------------------------ LLM
    def row_inputs(self, encoded: Encoded, keep) -> dict:
        """Model kwargs for one prefill over the kept visual tokens (all when keep is None): one row of
        the decoding engine (`batch.rows_spec`)."""
        st = encoded.state
        idx = keep_indices(keep, encoded.n_visual)
        ids, positions, vis_pos = st.input_ids, st.positions, st.visual_positions
        if idx is None:
            idx = torch.arange(encoded.n_visual, device=vis_pos.device)  # host metadata, as keep_indices' result
        rows = encoded.visual[idx]
        if isinstance(keep, Selection) and keep.tokens is not None:
            if keep.tokens.shape != rows.shape:
                raise ValueError(f"Selection.tokens must be {tuple(rows.shape)}, got {tuple(keep.tokens.shape)}")
            rows = keep.tokens.to(rows.dtype)
        seq_keep = torch.ones(ids.shape[1], dtype=torch.bool, device=ids.device)
        dropped = torch.ones(encoded.n_visual, dtype=torch.bool, device=vis_pos.device)
        dropped[idx] = False
        seq_keep[vis_pos[dropped]] = False
        device = self.model.device
        out = {"input_ids": ids[:, seq_keep].to(device),
               "position_ids": positions[:, :, seq_keep].to(device),  # gathered, not recomputed
               "attention_mask": torch.ones(1, int(seq_keep.sum()), dtype=torch.long, device=device),
               "mm_encoder_outputs": {st.modality: self._encoder_outputs(encoded, rows, idx)}}
        return out

    _llm_inputs = row_inputs  # the name the tests and the in-LLM tests use

    def _encoder_outputs(self, encoded: Encoded, rows: torch.Tensor, idx: torch.Tensor):
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        return BaseModelOutputWithPooling(pooler_output=(rows.to(self.model.device),))

    def next_position(self, encoded: Encoded) -> int:
        """First decoding position: the UNPRUNED max position + 1 (= L_full + rope_delta)."""
        return int(encoded.state.positions.max()) + 1

    def llm_inputs(self, encoded: Encoded) -> LLMInputs:
        """`embed_tokens(input_ids)` with the visual rows written at the placeholders (what the model's
        `masked_scatter` does), the M-RoPE positions computed once on the full sequence, no layer
        positions (the text model passes none for 3-row positions), decoding at the UNPRUNED max
        position + 1; Qwen3-VL: the deepstack features."""
        st = encoded.state
        device = self.model.device
        ids = st.input_ids.to(device)  # (1, L)
        vis = st.visual_positions.to(device)  # (N_V,)
        embeds = self.model.get_input_embeddings()(ids)  # (1, L, d)
        embeds[0, vis] = encoded.visual.to(device, embeds.dtype)
        deepstack = st.deepstack
        if deepstack is not None:
            deepstack = [f.to(device, embeds.dtype) for f in deepstack]
        return LLMInputs(embeds=embeds, rope_positions=st.positions.to(device), layer_positions=None,
                         visual_positions=vis, next_position=self.next_position(encoded), deepstack=deepstack)

    def fixed_length_kwargs(self, n: int) -> dict:
        return {"eos_token_id": []}  # the engine's greedy loop: no EOS, so it decodes max_new_tokens

    @torch.no_grad()
    def prefill_logits(self, encoded: Encoded, keep=None) -> torch.Tensor:
        out = self.model(**self.row_inputs(encoded, keep), use_cache=False)
        return out.logits[0].float().cpu()  # (L, vocab)

    def generate(self, encoded: Encoded, keep=None, max_new_tokens: int | None = None, *,
                 config: GenerationConfig | None = None, logits_processor=None, **gen) -> Answer:
        """Greedy decoding with a KV cache and explicit M-RoPE positions (see module docstring): the
        decoding engine on a batch of one (`batch.generate_rows`), on the adapter's `decode_path`.
        `config` (a `GenerationConfig`) or its fields as keywords; logits_processor: f(ids, scores), beside it."""
        return self.generate_batch([(encoded, keep)], config=GenerationConfig.of(max_new_tokens, config, **gen),
                                   logits_processor=logits_processor)[0]

    def generate_batch(self, rows, max_new_tokens: int | None = None, *, path=None,
                       config: GenerationConfig | None = None, logits_processor=None, **gen) -> list[Answer]:
        """Greedy answers of several (encoding, keep) rows as one left-padded batch (`batch.py`);
        `path`: a DecodePath (None: `decode_path`)."""
        from .batch import generate_rows
        return generate_rows(self, list(rows), GenerationConfig.of(max_new_tokens, config, **gen), path,
                             processors(logits_processor))


class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    """Qwen2.5-VL: window attention in the ViT, seconds-per-patch temporal positions."""

    family = "qwen2_5_vl"

    def _attention_block(self, target: int | None = None) -> int:
        """The target moved to the nearest full-attention block at or before it that the tower has (none: its windows)."""
        target, depth = super()._attention_block(target), len(self.model.model.visual.blocks)
        full = sorted(b for b in self.config.vision_config.fullatt_block_indexes if b < depth)
        before = [b for b in full if b <= target]
        return before[-1] if before else (full[0] if full else target)

    def _attention_order(self, grid: torch.Tensor):
        from transformers.vision_utils import get_vision_window_index
        vc = self.config.vision_config
        window_index, _ = get_vision_window_index(grid.cpu(), spatial_merge_size=vc.spatial_merge_size,
                                                  window_size=vc.window_size, patch_size=vc.patch_size)
        return window_index.cpu()

    def _video_rope_kwargs(self, indices: list[int], fps: float, total: int) -> dict:
        """Qwen2_5_VLProcessor: second_per_grid_ts = T / sampled fps, sampled fps = n / total * fps."""
        sampled_fps = len(indices) / total * fps if fps and total else (fps or 24.0)
        return {"second_per_grid_ts": torch.tensor([self.temporal / sampled_fps])}


__all__ = ["Qwen2VLAdapter", "Qwen2_5_VLAdapter", "merge_attention", "smart_resize"]
