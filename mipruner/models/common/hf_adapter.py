"""`ProcessorAdapter`: the neutral base of the adapters fed a transformers processor's inputs and
`inputs_embeds` (the llava/, onevision/ and internvl/ families): loading, prompt building, splicing kept
tokens, generation. No family code here: each family folder subclasses it. Vision-encoder attention
capture is in `clip_attention.py`; the map from processed pixels back to the original image is each
family's (`llava/geometry.py`, `onevision/layout.py`, `internvl/layout.py`).

The family files (`llava/llava_hf.py`, `llava_next.py`, `video_llava.py`; `onevision/adapter.py`,
`internvl/adapter.py`) only say how to turn media into processor inputs, visual tokens and their
geometry. Everything that runs the LLM lives here:

  encode          media + prompt -> templated prompt -> input_ids with N_V visual placeholders (the
                  prompt tokenized once where the family gives only pixels: its placeholders expanded);
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
the same numbers whether or not attention was requested. Any other block a method asks for (and its
per-head maps, and the projector's input as `features`) is recorded in the same pass (`common/signals.py`). CLIP at 577 tokens costs a few tens of MB
more in eager; pass `vision_attn="sdpa"` to trade attention capture for that memory.
"""
from __future__ import annotations

import time

import torch

from ...media import Video, load_media
from ...pruners.selection import Selection, check_choice
from .path import PrefillTimer, cuda_sync
from ...pruners.signals import Signals
from .signals import encoded_fields
from ..base import Abilities, Adapter, Answer, Encoded, LLMInputs, check_prompt, keep_indices
from .generation import GenerationConfig, processors
from .request import ProcessorState
from .text import TEXT_MODES, text_mask
from .views import check_views

POSITIONS = ("compact", "original")


# ----------------------------------------------------------------------------------------------
# loading


def default_device() -> torch.device:
    """CUDA when the machine has it: where a 7B checkpoint is meant to run."""
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


def _with_prefix(embeds: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor, vpos: torch.Tensor):
    """`prefix` (P, d) inserted right before the first visual token of the pruned sequence; each
    prefix row takes the first visual token's original position (used with positions="original")."""
    at = int((positions < vpos[0]).sum())  # the pruned sequence's index of the visual block
    pos = vpos[:1].to(positions.device).expand(prefix.shape[0])
    return (torch.cat([embeds[:at], prefix, embeds[at:]]), torch.cat([positions[:at], pos, positions[at:]]))


# ----------------------------------------------------------------------------------------------
# the shared adapter


class ProcessorAdapter(Adapter):
    """Shared body of the processor-fed adapters (LLaVA, OneVision, InternVL). Subclasses set `model_class_name` and implement
    `_inputs` (media + templated prompt -> processor-style inputs) and `_visual` (inputs ->
    visual tokens, geometry, frames, the vision tower, and how many images it ran on)."""

    model_class_name = ""
    default_frames = 8  # frames sampled from a video (Video-LLaVA)
    abilities = Abilities(batch_decoding=True)  # `generate_batch`: the decoding engine

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
                        vision_attn: str = "eager", **kwargs) -> "ProcessorAdapter":
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

    def read_media(self, media):
        """`_media`: what `encode` reads, decoded (the engine calls it outside the model's slot)."""
        return self._media(media)

    def _encode_visual(self, media, templated: str, want: Signals, held=None) -> dict:
        """-> dict(input_ids (1, L), visual (N_V, d), geometry, frames, is_video, ref (plain-model
        inputs), attention/keys/has_cls/extra state, and what `want` asks more: blocks/depth/block
        (`common.signals.Record.finish`), features (N_V, d_vision))."""
        raise NotImplementedError

    # -- encode --------------------------------------------------------------------------------

    def _check_length(self, n: int) -> None:
        if self.max_positions and n > self.max_positions:
            raise ValueError(f"the prompt is too long: {n} tokens with the visual tokens, the model's "
                             f"context is {self.max_positions} (max_position_embeddings)")

    def _tokenize(self, text: str, **kw):
        return self.tokenizer(text, return_tensors="pt", **kw)

    def encode(self, media, prompt: str, *, text_mode: str = "question", need_attention: bool = False,
               signals: Signals | None = None, views: str = "all") -> Encoded:
        """views: "all" (every view the model reads) or "base" (anyres families: one image's base view only)."""
        return self._encode(media, prompt, text_mode=text_mode, need_attention=need_attention, signals=signals,
                            views=check_views(self, views))

    @torch.no_grad()
    def _encode(self, media, prompt: str, *, text_mode: str, need_attention: bool, signals: Signals | None,
                held=None, views: str = "all") -> Encoded:
        """`encode`; `held`: this item's share of a batched tower call (`encode_batch`), or None."""
        check_prompt(prompt)
        want = Signals.of(need_attention, signals)
        check_choice("text_mode", text_mode, TEXT_MODES)
        t0 = time.perf_counter()
        media = self._media(media)
        kind = "video" if isinstance(media, Video) else "image"
        templated = self._template(prompt, kind, n_media=len(media.frames) if isinstance(media, Video)
                                   else len(media) if isinstance(media, list) else 1)
        # cheap length check before running the vision tower (text tokens alone)
        plain = self.tokenizer(templated, return_offsets_mapping=True)
        self._check_length(len(plain["input_ids"]))
        out = self._encode_visual(media, templated, want, held, **({"views": views} if views != "all" else {}))
        source = out.get("expanded", templated)  # placeholders that expand into text too (InternVL's <img>)
        if "expanded" in out:
            plain = self.tokenizer(source, return_offsets_mapping=True)
        if "placeholders" in out:  # the prompt tokenized once: its visual placeholders expanded to the tokens' count
            ids = expand_placeholders(plain["input_ids"], self._visual_token_ids(), out["placeholders"])
            out["ref"] = dict(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], **out.get("ref", {}))
        else:
            ids = out["input_ids"][0]
        ids = ids.cpu()  # (L,) host ids (a processor's or ours): the checks below read them without a device sync
        self._check_length(int(ids.numel()))
        vis_mask = self._visual_mask(ids)  # (L,) bool
        n_v = int(vis_mask.sum())
        visual = out["visual"]
        if n_v != visual.shape[0]:
            raise RuntimeError(f"{n_v} visual placeholders in the prompt but {visual.shape[0]} visual tokens")
        text_ids_host = ids[~vis_mask]  # (N_P,)
        embeds = self.model.get_input_embeddings()(text_ids_host.to(self.device))  # (N_P, d)
        # token strings and offsets of the non-visual tokens, from the un-expanded templated prompt
        special = set(self._visual_token_ids())
        keep_tok = [i for i, t in enumerate(plain["input_ids"]) if t not in special]
        text_ids = [plain["input_ids"][i] for i in keep_tok]
        if text_ids != text_ids_host.tolist():
            raise RuntimeError("the tokenizer and the processor disagree on the prompt's text tokens")
        offsets = [tuple(plain["offset_mapping"][i]) for i in keep_tok]
        tokens = self.tokenizer.convert_ids_to_tokens(text_ids)
        tmask = text_mask(tokens, offsets, source, prompt, text_mode)
        cuda_sync(self.device)
        state = ProcessorState(input_ids=ids.to(self.device),
                               visual_positions=torch.nonzero(vis_mask).flatten().to(self.device),
                               ref=out.get("ref", {}), templated=templated, extra=dict(out.get("state", {})))
        return Encoded(model=self.name, prompt=prompt, visual=visual, geometry=out["geometry"], text=embeds,
                       text_tokens=tokens, text_mask=tmask, text_mode=text_mode, frames=out["frames"],
                       is_video=out.get("is_video", False), attention=out.get("attention"),
                       keys=out.get("keys"), has_cls=out.get("has_cls", False), cls=out.get("cls"), state=state,
                       timings={"encode_s": time.perf_counter() - t0}, **encoded_fields(out, want))

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
        own = keep.positions if isinstance(keep, Selection) else None  # the method's release's rule (FastVID)
        positions = check_choice("positions", positions or own or self.positions, POSITIONS)
        idx = keep_indices(keep, encoded.n_visual, allow_prefix=True)
        st = encoded.state
        ids, vpos = st.input_ids, st.visual_positions
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
                         visual_positions=encoded.state.visual_positions.to(embeds.device),
                         next_position=int(embeds.shape[1]))

    @torch.no_grad()
    def generate(self, encoded: Encoded, keep=None, max_new_tokens: int | None = None, positions: str | None = None,
                 *, config: GenerationConfig | None = None, logits_processor=None, **gen) -> Answer:
        """Greedy (`do_sample=False`) through the model's own `generate`: `config` (a `GenerationConfig`)
        or its fields as keywords (`max_new_tokens` None: 64), other `generate` keywords pass through;
        `logits_processor` (callables) beside it, handed to `generate` as its own `logits_processor=`.

        prefill_s: from the call to the first logits (timestamped by a LogitsProcessor, i.e. after
        the prefill forward); decode_s: the rest. A non-plain `decode_path` answers through the
        batched decoder (a batch of one, bucketed, static cache).
        """
        from transformers import LogitsProcessorList

        config = GenerationConfig.of(max_new_tokens, config, **gen)
        procs = processors(logits_processor)
        if not self.decode_path.plain:
            return self.generate_batch([(encoded, keep)], positions=positions, config=config, logits_processor=procs)[0]
        p = self.pruned_inputs(encoded, keep, positions)
        timer = PrefillTimer()
        gen = config.generate_kwargs()
        procs = LogitsProcessorList(list(procs) + [timer])
        if self.tokenizer.pad_token_id is not None:
            gen.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        kw = {} if p["position_ids"] is None else {"position_ids": p["position_ids"]}
        cuda_sync(self.device)
        t0 = time.perf_counter()
        out = self.model.generate(inputs_embeds=p["inputs_embeds"], attention_mask=p["attention_mask"],
                                  logits_processor=procs, **kw, **gen)
        cuda_sync(self.device)
        t1 = time.perf_counter()
        first = timer.first if timer.first is not None else t1
        ids = out[0].tolist()  # with inputs_embeds only, generate returns the new tokens only
        return Answer(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                      input_tokens=int(p["inputs_embeds"].shape[1]),
                      visual_tokens=int(p["inputs_embeds"].shape[1]) - int(encoded.text.shape[0]),
                      prefill_s=first - t0, decode_s=t1 - first)

    def generate_batch(self, rows, max_new_tokens: int | None = None, positions: str | None = None, *,
                       path=None, config: GenerationConfig | None = None, logits_processor=None,
                       **gen) -> list[Answer]:
        """Greedy answers of several (encoding, keep) rows as one left-padded batch (`common/embeds_rows.py`);
        `config` or its fields as keywords and `logits_processor` beside it, as `generate`; `path`: a DecodePath
        (None: `decode_path`)."""
        from .embeds_rows import generate_rows

        return generate_rows(self, list(rows), GenerationConfig.of(max_new_tokens, config, **gen), positions,
                             path or self.decode_path, processors(logits_processor))


def expand_placeholders(ids: list[int], visual_ids: list[int], counts: list[int]) -> torch.Tensor:
    """(L,) int64 on the host: `ids` (the templated prompt's tokens) with its i-th visual placeholder token repeated
    counts[i] times, what a processor's tokenization of the expanded prompt gives (one <image> -> N_V <image>
    tokens); RuntimeError when the placeholders and the counts disagree."""
    special = set(visual_ids)
    at = [i for i, t in enumerate(ids) if t in special]
    if len(at) != len(counts):
        raise RuntimeError(f"{len(at)} visual placeholders in the prompt for {len(counts)} images")
    out, start = [], 0
    for i, n in zip(at, counts):
        out += ids[start:i] + [ids[i]] * int(n)
        start = i + 1
    return torch.tensor(out + ids[start:], dtype=torch.long)

