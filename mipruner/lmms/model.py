"""The lmms-eval model `mipruner`: any supported model, any pruning method, one answer per request.

    --model mipruner --model_args pretrained=llava-hf/llava-1.5-7b-hf,method=mi,budget=64,lam=1

model_args (besides the method's own settings, e.g. lam, tau, aggregation, normalization for
"mi", seed for "random", layer for "fastv" / "dart"; see `mipruner.lmms.answer`):
  pretrained   hub id, local folder or alias ("shapes-llava"); every family of `mipruner.models`
  method       "none" (no pruning) or any method of `mipruner.list_pruners()`, "fastv", "dart"
  budget       tokens (64), a share of the visual tokens (0.25) or a percentage (25%)
  text_mode    which prompt tokens the text-conditioned methods score (default "question", below)
  dtype        float16 | bfloat16 | float32 (default: the adapter's choice)
  device       default: the device accelerate gives this process (cuda:<local rank>, or cpu)
  cache_dir    per-sample answer cache: a killed or interrupted run resumes there (`cache.py`)
  plugins      modules or .py files registering more methods, ":"-separated (model_args are split at
               commas), e.g. plugins=my_pruners,method=center; installed plug-ins load by themselves

Which prompt tokens MI scores. lmms-eval builds each prompt as the question plus the task's
instruction, e.g. POPE's "Is there a dog in the image?\\nAnswer the question using a single word
or phrase."; that whole text is the user's message the model answers. By default
(`text_mode=question`, the library's default) the text-conditioned methods score all of it:
the user's prompt, which is what MI-Pruner scores visual tokens against (the paper's "user
prompts"), while the chat template's own tokens are left out. `text_mode=nostop` scores the
prompt without stopwords and punctuation: every word of the usual instructions ("answer",
"question", "using", "single", "word", "phrase", "please", "yes", "no", ...) is in
`mipruner.models.common.text.STOPWORDS`, so only the question's content words remain ("dog"); stopwords
are judged token by token, so a word a tokenizer splits into pieces may leave a piece.
`text_mode=prompt` scores the chat template's tokens too. The model always reads the whole prompt.

Answers are greedy, as in the paper; a task asking for sampling or beam search is refused.
Rank and world size come from the process group when there is one (`accelerate launch` on a
CPU-only machine sets one up while accelerate's own state says one process), else from
accelerate; the device from accelerate. lmms-eval splits the documents between the ranks.
Sweeps: loaded adapters are kept per process, so the runs of a sweep load the model once; with
`cache_dir`, the first run also answers the sweep's other configurations on each encoding
(`SWEEP_ENV`, set by `python -m mipruner.lmms`) and the later runs read them from the cache.
"""
from __future__ import annotations

import logging
import os
import signal

import torch
from lmms_eval.api.model import lmms
from PIL import Image

import mipruner

from ..serve.failures import guarded
from ..media import media_hash
from .answer import MethodConfig, answer_encoded, compute_summary
from .cache import AnswerCache, answer_key

log = logging.getLogger("mipruner.lmms")
_ADAPTERS: dict[tuple, object] = {}  # (pretrained, device, dtype) -> adapter, per process
# Fault injection for tests of resuming: the process kills itself (SIGKILL: no cleanup, like a crash
# or a preempted job) right after caching its N-th newly computed answer.
ABORT_ENV = "MIPRUNER_LMMS_ABORT_AFTER"
# Set by `python -m mipruner.lmms` for a sweep ("|" alternatives or --config): every run's model_args (JSON list).
SWEEP_ENV = "MIPRUNER_LMMS_SWEEP"
_NOT_METHOD = ("pretrained", "dtype", "device", "cache_dir", "batch_size", "max_batch_size", "plugins")
_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32}


def load_adapter(pretrained: str, device: str, dtype: str | None):
    """The adapter for (pretrained, device, dtype), loaded once per process."""
    if dtype not in (None, "auto") and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)} or auto, got {dtype!r}")
    key = (pretrained, device, dtype)
    if key not in _ADAPTERS:
        _ADAPTERS[key] = mipruner.load(pretrained, device=device, dtype=_DTYPES.get(dtype))
        log.warning("mipruner: loaded %s on %s (kept for the next runs of this process)", pretrained, device)
    return _ADAPTERS[key]


def load_plugins_once(plugins) -> list[str]:
    """Import the `plugins=` modules (a sweep's runs name the same ones: imported once); the problems."""
    from mipruner.plugins import load_plugins, problems

    if plugins:
        load_plugins(str(plugins), source="model_args plugins=")
    else:
        mipruner.list_pruners()  # the installed plug-ins and MIPRUNER_PLUGINS
    return problems()


def to_media(visuals):
    """What lmms-eval's doc_to_visual gave, as media an adapter reads; plain errors otherwise."""
    visuals = list(visuals) if isinstance(visuals, (list, tuple)) else [visuals]
    if not visuals:
        raise ValueError("this task gives no image or video: mipruner prunes visual tokens, so it needs one")
    if all(isinstance(v, Image.Image) for v in visuals):
        return visuals[0] if len(visuals) == 1 else visuals
    if len(visuals) == 1 and (isinstance(visuals[0], str) or hasattr(visuals[0], "frames")):
        return visuals[0]  # a path (image or video file) or a mipruner.media.Video
    raise ValueError(f"unsupported visuals for one question: {[type(v).__name__ for v in visuals]} "
                     "(give PIL images, one image or video path, or one mipruner.media.Video)")


def media_key(visuals) -> str:
    """The answer cache's media key: the hash of the media the adapter reads (`to_media`), the same
    `mipruner.media.media_hash` that keys the app's encodings, so equal media get equal keys in both."""
    return media_hash(to_media(visuals))


class MiPruner(lmms):
    """lmms-eval "simple" model: the adapter applies the model's own chat template to the prompt."""

    is_simple = True

    def __init__(self, pretrained: str = "shapes-llava", method: str = "none", budget=None,
                 text_mode: str = "question", dtype: str | None = None, device: str | None = None,
                 cache_dir: str | None = None, batch_size=1, max_batch_size=None, plugins: str | None = None,
                 **method_params) -> None:
        super().__init__()
        from accelerate import Accelerator

        for problem in load_plugins_once(plugins):
            log.warning("mipruner: %s", problem)
        self.config = MethodConfig.parse(method, budget, text_mode, **method_params)
        acc = Accelerator()
        self.accelerator = acc
        self._rank, self._world_size = acc.process_index, acc.num_processes
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # `accelerate launch --multi_gpu` on CPU-only machines sets up the process group but its
            # state says one process; the process group is the truth there (and equal elsewhere)
            self._rank, self._world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if device is None or (acc.num_processes > 1 and str(device) == "cuda"):
            device = str(acc.device)
        self._device = torch.device(device)
        self.pretrained = str(pretrained)
        self.adapter = load_adapter(self.pretrained, str(self._device), dtype)
        self._key_prefix = f"{self.pretrained}|{dtype}|{self._device.type}|"
        self.cache = AnswerCache(cache_dir, self._rank) if cache_dir else None
        self.sweep = self._sweep(dtype, cache_dir)
        self.batch_size_per_gpu = int(batch_size)  # requests encoded per vision-tower call; answers one by one
        self.calls = 0  # model answers computed by this instance (cache hits excluded)
        self.failures: list[str] = []  # "task/doc: sentence" of each answer a method failed to give
        self.computes: list = []  # this run's selections' prefill compute (`mipruner.measure.compute`), answers computed

    def _sweep(self, dtype, cache_dir) -> list[MethodConfig]:
        """This run's configuration, then the sweep's other runs answered on the same encodings (same
        model, dtype, cache folder, text_mode and attention capture). Without a cache folder: this run only."""
        import json

        runs = json.loads(os.environ.get(SWEEP_ENV) or "[]")
        if not runs or self.cache is None:
            return [self.config]
        from lmms_eval.utils import simple_parse_args_string

        out = {self.config.key(): self.config}
        for text in runs:
            args = simple_parse_args_string(text)
            if (str(args.get("pretrained", "shapes-llava")), args.get("dtype"), args.get("cache_dir")) != \
                    (self.pretrained, dtype, cache_dir):
                continue
            c = MethodConfig.parse(**{k: v for k, v in args.items() if k not in _NOT_METHOD})
            # one encoding serves the configurations that would encode alike (text_mode, and whether
            # the vision tower's attention is captured), so each answer is the one of a separate run
            if (c.text_mode, c.signals) == (self.config.text_mode, self.config.signals):
                out.setdefault(c.key(), c)
        return list(out.values())

    @property
    def device(self):
        return self._device

    @property
    def rank(self):
        return self._rank

    @property
    def world_size(self):
        return self._world_size

    def _generation(self, gen_kwargs: dict) -> tuple[int, list[str]]:
        gen = dict(gen_kwargs or {})
        if gen.get("do_sample") or int(gen.get("num_beams", 1) or 1) > 1:
            raise ValueError("mipruner answers greedily (the paper's protocol); this task asks for sampling or "
                             f"beam search: {gen}")
        until = gen.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        return int(gen.get("max_new_tokens", gen.get("max_gen_toks", 64))), until

    def generate_until(self, requests) -> list[str]:
        """Answers in request order. `batch_size` requests at a time are encoded together
        (`mipruner.serve.batch.encode_items`: one vision-tower call where the family batches its tower);
        each request is then answered on its own encoding."""
        from tqdm import tqdm

        from mipruner.serve.batch import encode_items

        requests = list(requests)
        step = max(1, self.batch_size_per_gpu)
        out = []
        bar = tqdm(total=len(requests), disable=self._rank != 0, desc="mipruner answering")
        for first in range(0, len(requests), step):
            group = []  # per request: [context, max_new, until, visuals, keys, text, task, doc_id]
            for req in requests[first:first + step]:
                context, gen_kwargs, doc_to_visual, doc_id, task, split = req.args
                max_new, until = self._generation(gen_kwargs)
                visuals = doc_to_visual(self.task_dict[task][split][doc_id])
                keys, text = [None] * len(self.sweep), None  # without a cache the sweep is this run only
                if self.cache is not None:
                    digest = media_key(visuals)
                    keys = [answer_key(self._key_prefix + c.key(), task, split, doc_id, context, digest, max_new)
                            for c in self.sweep]
                    text = self.cache.get(keys[0])
                group.append([context, max_new, until, visuals, keys, text, task, doc_id])
            todo_items = [g for g in group if g[5] is None]
            encs = encode_items(self.adapter, [(to_media(g[3]), g[0]) for g in todo_items], batch=step,
                                text_mode=self.config.text_mode, signals=self.config.signals)
            for g, enc in zip(todo_items, encs):
                g[5] = self._answer(enc, *g[1:3], g[4], g[6], g[7])
            for g in group:
                out.append(g[5])
                bar.update(1)
        bar.close()
        if self.cache is not None:
            log.warning("mipruner rank %d: %d answers computed, %d from the cache %s", self._rank, self.calls,
                        self.cache.hits, self.cache.folder)
        summary = compute_summary(self.computes)
        if summary is not None:
            log.warning("mipruner rank %d: %s budget=%s: %s", self._rank, self.config.method, self.config.budget,
                        summary)
        if self.failures:
            log.error("mipruner rank %d: %d answers failed (scored as empty), the first: %s", self._rank,
                      len(self.failures), self.failures[0])
        return out

    def _answer(self, enc, max_new: int, until: list[str], keys: list, task, doc_id) -> str:
        """This run's answer on `enc`, and the sweep's missing ones on the same encoding (cached)."""
        todo = [(c, k) for i, (c, k) in enumerate(zip(self.sweep, keys)) if i == 0 or not self.cache.has(k)]
        shared: dict = {}
        text = None
        for i, (c, k) in enumerate(todo):
            mine = self.computes if i == 0 else None  # this run's configuration (the first of `todo`)
            got, why = guarded(c.method, lambda c=c, mine=mine: answer_encoded(self.adapter, enc, c, max_new, shared,
                                                                                mine))
            if why is not None:  # this configuration failed on this document: an empty answer, not cached
                self.failures.append(f"{task}/{doc_id}: {why}")  # (a rerun retries); the others go on
                log.warning("mipruner rank %d: %s/%s: %s", self._rank, task, doc_id, why)
                text = "" if text is None else text
                continue
            t = got.text
            for stop in until:
                if stop and stop in t:
                    t = t.split(stop)[0]
            text = t if text is None else text  # the first of `todo` is this run's
            self.calls += 1
            if self.cache is not None:
                self.cache.put(k, t, task=task, doc_id=doc_id, config=c.key())
            if os.environ.get(ABORT_ENV) and self.calls >= int(os.environ[ABORT_ENV]):
                os.kill(os.getpid(), signal.SIGKILL)
        return text

    def loglikelihood(self, requests):
        raise NotImplementedError("mipruner answers by generation only: choose tasks with output_type generate_until")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("mipruner answers one question per request: multi-round tasks are not supported")
