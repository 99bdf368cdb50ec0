"""mipruner's web app: MI-Pruner and comparison pruners side by side on one model run.

    python app.py [--model ID|PATH] [--device cpu|cuda] [--dtype bf16|fp16|fp32] [--host H] [--port P] [--share]

Without --model (or when it cannot be loaded) the embedded model `shapes-llava` (assets/) is used,
so the app works offline. On a Hugging Face Space this file is the entry point (README front matter).
"""
from __future__ import annotations

import argparse
import os

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("MIPRUNER_MODEL", "shapes-llava"),
                   help="hub id, local directory or 'shapes-llava' (default; env MIPRUNER_MODEL)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    p.add_argument("--max-file-size", default="50mb", help="largest upload accepted (default 50mb)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="answer length limit (default 32)")
    return p.parse_args(argv)


def build(args: argparse.Namespace):
    import torch

    from components.hub import ModelHub
    from components.logic import AppLogic
    from components.spaces_gpu import gpu
    from components.ui import build_demo

    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    hub = ModelHub(args.model, device=args.device, dtype=dtype)
    print(hub.load_default(), flush=True)
    logic = AppLogic(hub, max_new_tokens=args.max_new_tokens, gpu=gpu)
    return build_demo(logic, auto_answers=hub.default == hub.fallback)


def main(argv=None) -> None:
    from components.ui import launch_kwargs

    args = parse_args(argv)
    demo = build(args)
    demo.queue(default_concurrency_limit=4).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                   **launch_kwargs(args.max_file_size))


if __name__ == "__main__":
    main()
