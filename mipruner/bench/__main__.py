"""Entry point: `python -m mipruner.bench <command> [options] [--plugins MODULES]` (--plugins, or env
MIPRUNER_PLUGINS: modules or .py files registering more methods, loaded before the command runs)."""
from __future__ import annotations

import importlib
import sys

from mipruner.plugins import load_for_cli, take_plugins_arg

COMMANDS = {
    "pruners": ("mipruner.bench.pruners", "each pruner's median time vs. a V @ T.T + topk floor"),
    "ops": ("mipruner.bench.ops", "aten ops per selection (profiler) and captured (CUDA graph) vs eager time, every method"),
    "prefill": ("mipruner.bench.prefill", "vision encode, prefill at keep 100/50/25/10%, pruning overhead"),
    "efficiency": ("mipruner.bench.efficiency", "end-to-end latency + peak memory per method x budget (incl. fastv, dart)"),
    "gpu": ("mipruner.bench.gpu", "paper protocol at LLaVA-1.5/NeXT-7B shapes: batch-1 latency vs plain generate, items/s at batch 1/8/32"),
    "latency": ("mipruner.bench.latency", "what a user waits for: TTFT and per-token decode at 2/32/128 new tokens vs "
                "transformers generate (eager, static+compiled), our unpruned path and the device's floor; goals"),
    "rows": ("mipruner.bench.rows", "a batch of unpruned rows: the decoding engine vs generate on the same batch, interleaved"),
    "slider": ("mipruner.bench.slider", "one slider update (prune + render) for mi/random/similarity, image and video"),
    "load": ("mipruner.bench.load", "the app under N concurrent sessions x M requests, 3 rounds: errors, leaks, latency, RSS"),
    "memory": ("mipruner.bench.memory", "the app's RSS over many sessions (image or video, any caps): does the last third level off"),
    "attacks": ("mipruner.bench.attacks", "a hostile visitor's attacks on a hosted launch (issue 55) and another visitor's "
                "Run under each: its time vs unloaded, RSS back, the disk under the cap"),
    "space-cost": ("mipruner.bench.space_cost", "a CPU Space's waits (start-up, encode, answers, a view) at the smallest "
                   "suggested model's real shape; --params: every suggested model's size"),
    "vllm": ("mipruner.bench.vllm", "TTFT and req/s through vLLM with and without pruning (the mipruner-vllm plug-in), "
             "interleaved, with the prompt-length floor"),
    "browser": ("mipruner.bench.browser", "slider move -> every panel updated in Chromium (p50/p95), embedded model"),
}
# maintainers' tools that left the package, and where they are in a checkout
MOVED = {"gpu-check": "python -m tests.gpu_check run (GPU acceptance, from the repository root; docs/gpu.md)"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, plugins = take_plugins_arg(argv)
    if argv and argv[0] in MOVED:
        print(f"`{argv[0]}` is not part of the package: {MOVED[argv[0]]}")
        return 2
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m mipruner.bench <command> [--help] [--plugins MODULES]\n\ncommands:")
        for name, (_, doc) in COMMANDS.items():
            print(f"  {name:<11} {doc}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    load_for_cli(plugins)
    rc = importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
