"""Several pruned prompts of the Qwen-VL family decoded as one batch by the decoding engine
(`common/decode.py`: padded prefills grouped by length, the one greedy loop).

Each row is exactly what `Qwen2VLAdapter.generate` feeds for one selection (`_llm_inputs`): the
pruned `input_ids`, the M-RoPE positions computed once on the row's UNPRUNED sequence and
gathered at its kept columns, and its kept visual rows (Qwen3-VL: with the same rows of every
deepstack tensor). A group of rows is left-padded to its width with the pad token, the pad columns
masked out (`attention_mask` 0) and their positions 0 (never attended); the group's visual rows go,
in row order, into one `mm_encoder_outputs` entry per modality (the model scatters them into the
placeholders in row-major order, which is the same order), and likewise each deepstack layer's rows.
On the compiled path the visual rows are placed before the compiled forward (`prefill.py`).

What differs from the LLaVA family is given to the engine (`rows.Rows`): these inputs and Qwen's
position rule. Decoding continues every row at ITS unpruned max position + 1 (`next_position`: rows
of different encodings have different starts; `rope_deltas` is never used because positions are
always passed), written (3, B, 1) for M-RoPE. The generation options arrive as one `GenerationConfig` (greedy; any
`extra` transformers argument is refused: Qwen never answers through `generate`). The `Rows` callbacks
close over plain data (each row's inputs, the pad id, the placeholder ids, the embedding module), never
over the adapter. `Qwen2VLAdapter.generate` is a batch of one of these. Timings are the batch's.
"""
from __future__ import annotations

import time

import torch

from ..common.generation import GenerationConfig
from ..common.path import DecodePath, trim_at_eos
from ..base import Answer, Encoded, keep_indices
from ..common import rows as R
from .prefill import placed_embeds, placed_prefill


def _merge_outputs(outs: list):
    """One encoder output from several rows' outputs (pooler rows and deepstack rows in row order)."""
    first = outs[0]
    pooled = tuple(t for o in outs for t in o.pooler_output)
    deep = getattr(first, "deepstack_features", None)
    if deep is None:
        return type(first)(pooler_output=pooled)
    layers = [tuple(t for o in outs for t in o.deepstack_features[i]) for i in range(len(deep))]
    return type(first)(pooler_output=pooled, deepstack_features=layers)


def pad_id(adapter) -> int:
    """The pad token of left-padded rows (0 when the tokenizer has none); never a visual placeholder."""
    pad = adapter.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    if pad in (adapter.config.image_token_id, adapter.config.video_token_id):
        raise ValueError("the pad token is a visual placeholder: cannot left-pad")
    return pad


def padded_inputs(ins: list[dict], width: int, pad: int) -> dict:
    """input_ids (n, W), position_ids (3, n, W), attention_mask (n, W) and mm_encoder_outputs of the rows'
    inputs `ins` (`Qwen2VLAdapter.row_inputs`), left-padded to `width` with the token `pad`."""
    ids, mask = R.left_pad([x["input_ids"][0] for x in ins], width, pad)
    pos, _ = R.left_pad([x["position_ids"][:, 0].T for x in ins], width, 0)  # (n, W, 3)
    by_modality: dict = {}
    for x in ins:
        for modality, out in x["mm_encoder_outputs"].items():
            by_modality.setdefault(modality, []).append(out)
    return dict(input_ids=ids, attention_mask=mask, position_ids=pos.permute(2, 0, 1).contiguous(),
                mm_encoder_outputs={m: _merge_outputs(o) for m, o in by_modality.items()})


def mm_prefill(model, x: dict):
    """The plain path's prefill: the model's forward on `padded_inputs` (visual rows as mm_encoder_outputs)."""
    out = model(input_ids=x["input_ids"], position_ids=x["position_ids"], attention_mask=x["attention_mask"],
                mm_encoder_outputs=x["mm_encoder_outputs"], use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], out.past_key_values


def rows_spec(adapter, rows: list[tuple[Encoded, object]], compiled: bool = False) -> R.Rows:
    """The rows for the decoding engine: Qwen's padded inputs (the visual rows placed before the forward
    when `compiled`), its prefill, each row's decoding start and M-RoPE step positions (3, B, 1)."""
    ins = [adapter.row_inputs(enc, keep) for enc, keep in rows]
    lengths = [int(x["input_ids"].shape[1]) for x in ins]
    pad = pad_id(adapter)
    embed = adapter.model.get_input_embeddings()
    tokens = {"image": int(adapter.config.image_token_id), "video": int(adapter.config.video_token_id)}

    def inputs(idx: list[int], width: int) -> dict:
        x = padded_inputs([ins[i] for i in idx], width, pad)
        return placed_embeds(embed, tokens, x) if compiled else x

    device = ins[0]["input_ids"].device
    starts = torch.tensor([adapter.next_position(enc) for enc, _ in rows], dtype=torch.long, device=device)
    return R.Rows(lengths=lengths, inputs=inputs, prefill=placed_prefill if compiled else mm_prefill,
                  next_pos=starts, step_positions=lambda at: at.view(1, -1, 1).expand(3, -1, 1))


@torch.no_grad()
def generate_rows(adapter, rows: list[tuple[Encoded, object]], config: GenerationConfig,
                  path: DecodePath | None = None, procs: tuple = ()) -> list[Answer]:
    """Greedy answers of `rows` ((encoding, keep) pairs) as one batch; see the module docstring. `procs`: the
    logits processors beside the config."""
    if not rows:
        return []
    if config.extra:
        raise ValueError(f"unsupported generation arguments: {sorted(config.extra)}; supported: max_new_tokens, "
                         f"min_new_tokens, eos_token_id, pad_token_id (and logits_processor beside the config)")
    path = path or adapter.decode_path
    config = config.resolve(adapter.model, pad_id(adapter))
    t0 = time.perf_counter()
    spec = rows_spec(adapter, rows, compiled=path.compile)
    top = int(spec.next_pos.max())
    if top + config.max_new_tokens > adapter.max_positions:
        raise ValueError(f"prompt ({top} positions) + max_new_tokens ({config.max_new_tokens}) exceeds "
                         f"the model's context {adapter.max_positions}")
    ids, t1 = adapter.decoder.decode(spec, config, path, procs)
    t2 = time.perf_counter()
    answers = []
    for (enc, keep), n, row in zip(rows, spec.lengths, ids):
        row = trim_at_eos(row, config.eos)
        n_vis = enc.n_visual if keep is None else int(keep_indices(keep, enc.n_visual).numel())
        answers.append(Answer(text=adapter.tokenizer.decode(row, skip_special_tokens=True), token_ids=row,
                              input_tokens=n, visual_tokens=n_vis, prefill_s=t1 - t0, decode_s=t2 - t1))
    return answers


__all__ = ["generate_rows", "mm_prefill", "padded_inputs", "rows_spec"]
