"""mipruner's web app: MI-Pruner and comparison pruners side by side on one model run.

    python app.py [--model ID|PATH] [--device cpu|cuda] [--dtype bf16|fp16|fp32] [--host H] [--port P] [--share]
                  [--allow-models IDS] [--max-model-gb GB] [--model-dirs DIRS] [--cache-mb MB] [--files-mb MB]
                  [--plugins MODULES] [--compile auto|on|off] [--max-body-kb KB] [--body-timeout-s S]
                  [--max-client-requests N] [--max-decode-s S]

Without --model (or MIPRUNER_MODEL) the app starts locally on the embedded model `shapes-llava`
(assets/), so it works offline; on a Hugging Face Space (SPACE_ID set) on a small real model chosen for
the Space's hardware (components/hosting/space_default.py). A start-up model that cannot be loaded leaves the
embedded model serving, and the status line says which and why. On a Space this file is the entry point
(README front matter); the model, the allow-list and the caps have environment variables (MIPRUNER_*,
see --help) for the Space's settings. Deploying one: docs/space.md.
Hosted (a Space, --share, or a non-loopback --host), visitors may load only the dropdown's models
unless --allow-models says otherwise; anywhere, checkpoints above --max-model-gb (read from the
hub's metadata before downloading) and local folders outside --model-dirs are refused.
Methods from outside the package (installed plug-ins, MIPRUNER_PLUGINS, --plugins) are imported
once, at start-up, before the page is built; then loading ends (`mipruner.plugins.freeze`), so no
request can import code, hosted or not. A plug-in left out is named on the page's status lines.
With --compile (auto: on CUDA outside a ZeroGPU Space) the start-up model answers on the compiled
decoding path once a warm-up has compiled the shapes of the first views (components/core/warmup.py); the
page's status line says so while it warms, and answers run on the plain path meanwhile.
"""
from __future__ import annotations

import argparse
import os
import tempfile

from components.hosting.spaces_gpu import prepare

prepare()  # on a ZeroGPU Space `spaces` patches torch: before anything imports it (components/hosting/spaces_gpu.py)

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MAX_FRAME_PIXELS = 4096 * 2160  # the largest video frame the app decodes (4K)


def _list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.replace(os.pathsep, ",").split(",") if p.strip())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="hub id, local directory or 'shapes-llava' (env MIPRUNER_MODEL; default: on a Hugging Face "
                        "Space a small real model for its hardware, components/hosting/space_default.py; else 'shapes-llava')")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=os.environ.get("MIPRUNER_DTYPE") or None,
                   help="weights dtype (default: bf16 on GPU, fp32 on CPU; env MIPRUNER_DTYPE)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    p.add_argument("--max-file-size", default=os.environ.get("MIPRUNER_MAX_FILE_SIZE", "50mb"),
                   help="largest upload accepted (default 50mb; env MIPRUNER_MAX_FILE_SIZE)")
    p.add_argument("--max-new-tokens", type=int, default=int(os.environ.get("MIPRUNER_MAX_NEW_TOKENS", 32)),
                   help="answer length limit (default 32; env MIPRUNER_MAX_NEW_TOKENS)")
    p.add_argument("--allow-models", default=os.environ.get("MIPRUNER_ALLOW_MODELS"),
                   help="model ids or glob patterns visitors may load, comma-separated ('*' = any id; default: "
                        "the dropdown's models when hosted, any id when local; env MIPRUNER_ALLOW_MODELS)")
    p.add_argument("--max-model-gb", type=float, default=None,
                   help="refuse checkpoints larger than this, read from the hub before downloading (0: no cap; "
                        "default 30, 5 on a CPU Space; env MIPRUNER_MAX_MODEL_GB)")
    p.add_argument("--model-dirs", default=os.environ.get("MIPRUNER_MODEL_DIRS", ""),
                   help="folders visitors may load local models from, comma-separated (default: none)")
    p.add_argument("--cache-mb", type=int, default=int(os.environ.get("MIPRUNER_CACHE_MB", 1024)),
                   help="cached encodings of all sessions together, least recently used dropped first (default 1024; "
                        "env MIPRUNER_CACHE_MB)")
    p.add_argument("--files-mb", type=int, default=int(os.environ.get("MIPRUNER_FILES_MB", 1024)),
                   help="uploads, rendered panels and exports kept on disk: an upload that does not fit is refused, "
                        "the oldest panels and exports are removed first (default 1024; env MIPRUNER_FILES_MB)")
    p.add_argument("--max-body-kb", type=int, default=int(os.environ.get("MIPRUNER_MAX_BODY_KB", 1024)),
                   help="largest request body that is not an upload (JSON calls), counted as it arrives (default "
                        "1024; env MIPRUNER_MAX_BODY_KB)")
    p.add_argument("--body-timeout-s", type=float, default=float(os.environ.get("MIPRUNER_BODY_TIMEOUT_S", 30)),
                   help="a request body that sends nothing for this long is stopped (HTTP 408; default 30; a whole "
                        "body may take 20 times this; env MIPRUNER_BODY_TIMEOUT_S)")
    p.add_argument("--max-client-requests", type=int, default=int(os.environ.get("MIPRUNER_MAX_CLIENT_REQUESTS", 64)),
                   help="requests of one client address in progress at once, past it HTTP 429 (default 64; env "
                        "MIPRUNER_MAX_CLIENT_REQUESTS)")
    p.add_argument("--new-sessions-per-min", type=float, default=os.environ.get("MIPRUNER_NEW_SESSIONS_PER_MIN"),
                   help="new browser sessions one address may open a minute, as many at once (HTTP 429 past it; 0: no "
                        "bound; default 20 when hosted, else 0; env MIPRUNER_NEW_SESSIONS_PER_MIN)")
    p.add_argument("--head-timeout-s", type=float, default=float(os.environ.get("MIPRUNER_HEAD_TIMEOUT_S", 10)),
                   help="seconds a connection may take to send a request's headers before it is closed with HTTP 408 "
                        "(default 10; env MIPRUNER_HEAD_TIMEOUT_S)")
    p.add_argument("--max-client-connections", type=int, default=os.environ.get("MIPRUNER_MAX_CLIENT_CONNECTIONS"),
                   help="connections one address may hold open (HTTP 429 past it; 0: no cap; default 32, on a Space 0: "
                        "every connection comes from its proxy; env MIPRUNER_MAX_CLIENT_CONNECTIONS)")
    p.add_argument("--max-decode-s", type=float, default=float(os.environ.get("MIPRUNER_MAX_DECODE_S", 30)),
                   help="seconds one video may take to decode before it is refused, uploads and sweep items alike "
                        "(0: no bound; default 30; env MIPRUNER_MAX_DECODE_S)")
    p.add_argument("--plugins", default=None,
                   help="modules or .py files registering more methods, comma-separated, imported at start-up "
                        "(env MIPRUNER_PLUGINS too; installed plug-ins load by themselves)")
    p.add_argument("--max-sessions", type=int, default=int(os.environ.get("MIPRUNER_MAX_SESSIONS", 1000)),
                   help="browser sessions whose state Gradio keeps, and sessions that encoded the app keeps beside "
                        "them, least recently used dropped (default 1000; env MIPRUNER_MAX_SESSIONS)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default=os.environ.get("MIPRUNER_COMPILE", "auto"),
                   help="answer on the compiled decoding path after a warm-up at start-up: auto (default: on CUDA "
                        "outside a ZeroGPU Space), on or off (env MIPRUNER_COMPILE)")
    args = p.parse_args(argv)
    if args.compile not in ("auto", "on", "off"):  # from MIPRUNER_COMPILE
        p.error(f"MIPRUNER_COMPILE must be auto, on or off, got {args.compile!r}")
    if args.dtype is not None and args.dtype not in DTYPES:  # from MIPRUNER_DTYPE (argparse checks only flags)
        p.error(f"MIPRUNER_DTYPE must be one of {', '.join(sorted(DTYPES))}, got {args.dtype!r}")
    args.model_role = ""  # e.g. "this Space's default on a CPU": named by the status line if it cannot be loaded
    from components.hosting.space_default import max_model_gb, start_model

    if args.model is None:
        args.model, args.model_role = start_model()
    if args.max_model_gb is None:
        args.max_model_gb = max_model_gb()
    return args


def model_policy(args: argparse.Namespace):
    """The ModelPolicy the flags describe (defaults depend on whether the app is hosted)."""
    from components.hosting.hub import SUGGESTED
    from components.hosting.policy import ModelPolicy, is_hosted

    if args.allow_models is None:
        allow = tuple(dict.fromkeys((*SUGGESTED, args.model))) if is_hosted(args.host, args.share) else None
    else:
        allow = _list(args.allow_models)
        allow = None if "*" in allow else allow
    return ModelPolicy(allow=allow, max_bytes=int(args.max_model_gb * 1e9) if args.max_model_gb > 0 else None,
                       model_dirs=_list(args.model_dirs), trusted=(args.model,))


def file_budget(args: argparse.Namespace):
    """The cap on Gradio's files (uploads, rendered panels, exports), in a folder of this app's own."""
    from gradio.utils import get_upload_folder

    from mipruner.serve.session import FileBudget

    os.environ.setdefault("GRADIO_TEMP_DIR", os.path.join(tempfile.gettempdir(), "gradio-mipruner"))
    return FileBudget([get_upload_folder()], args.files_mb << 20)


def body_limits(args: argparse.Namespace):
    """What one request may send (components/hosting/uploads.py), from the flags."""
    from components.hosting.uploads import Limits

    for flag, value in (("--max-body-kb", args.max_body_kb), ("--body-timeout-s", args.body_timeout_s),
                        ("--max-client-requests", args.max_client_requests)):
        if not value > 0:
            raise SystemExit(f"{flag} must be > 0, got {value!r}")
    from components.hosting.policy import is_hosted

    per_min = args.new_sessions_per_min
    per_min = (20.0 if is_hosted(args.host, args.share) else 0.0) if per_min is None else float(per_min)
    if not per_min >= 0:
        raise SystemExit(f"--new-sessions-per-min must be >= 0, got {per_min!r}")
    return Limits(max_body_bytes=args.max_body_kb << 10, idle_s=args.body_timeout_s, body_s=20 * args.body_timeout_s,
                  per_client=args.max_client_requests, new_sessions_per_min=per_min)


def decode_bounds(args: argparse.Namespace):
    """Bounds on decoding any video (mipruner/media.py), set for the whole process: frames decoded (as many as
    an upload may state, components/core/checks.py), a frame's pixels (4096x2160) and --max-decode-s."""
    from components.core.checks import MAX_VIDEO_FRAMES
    from mipruner.media import DecodeLimits, set_decode_limits

    if args.max_decode_s < 0:
        raise SystemExit(f"--max-decode-s must be >= 0, got {args.max_decode_s!r}")
    limits = DecodeLimits(frames=MAX_VIDEO_FRAMES, pixels=MAX_FRAME_PIXELS, seconds=args.max_decode_s or None)
    set_decode_limits(limits)
    return limits


def build(args: argparse.Namespace, files=None):
    import torch

    from gradio.utils import get_upload_folder

    from components.core.logic import AppLogic
    from components.core.sweep_queue import SweepLimits
    from components.hosting.hub import ModelHub, hub_reachable
    from components.hosting.policy import is_hosted
    from components.page.ui import build_demo
    from mipruner.plugins import freeze, load_for_cli

    decode_bounds(args)
    files = files or file_budget(args)  # Gradio's files in a folder of this app's own, kept under --files-mb
    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    hub = ModelHub(args.model, device=args.device, dtype=dtype, policy=model_policy(args),
                   cache_bytes=args.cache_mb << 20)
    problems = load_for_cli(args.plugins)  # also printed to stderr
    freeze("the app loads plug-ins only at start-up, from its own flags and environment")
    print(hub.load_default(getattr(args, "model_role", ""), reachable=hub_reachable), flush=True)
    fell_back = hub.default == hub.fallback != args.model  # the start-up model could not be loaded
    notes = " ".join(([hub.startup_message] if fell_back else []) + list(problems))
    hub.startup_message = " ".join(m for m in (hub.startup_message, " ".join(problems), hardware_note(hub)) if m)
    exports = os.path.join(get_upload_folder(), "mipruner-exports")
    warm = warm_up(args, hub)
    logic = AppLogic(hub, max_new_tokens=args.max_new_tokens, gpu=handler_wrapper(), files=files,
                     export_root=exports, notes=notes, warm=warm)
    demo = build_demo(logic, auto_answers=hub.default == hub.fallback,
                      sweep_limits=SweepLimits.for_server(is_hosted(args.host, args.share)),  # hosted: small, timed
                      max_sessions=args.max_sessions)
    if warm is not None:
        warm.start()
    return demo


def handler_wrapper():
    """What wraps the handlers that run the model: ZeroGPU's `spaces.GPU` task on a ZeroGPU Space, else None (off
    ZeroGPU `gpu` returns each handler as it is; with None a CPU app streams its answers one by one)."""
    from components.hosting.spaces_gpu import gpu, on_zero_gpu

    return gpu if on_zero_gpu() else None


def warm_up(args: argparse.Namespace, hub):
    """The start-up model's warm-up of the compiled decoding path (components/core/warmup.py), not started;
    None when the app answers on the plain path (--compile, the device, a ZeroGPU Space)."""
    from components.core.examples import load_examples
    from components.core.settings import DEFAULT_METHODS
    from components.core.warmup import WarmUp, compile_choice
    from components.hosting.spaces_gpu import on_zero_gpu
    from components.page.controls import DEFAULT_SHARE

    engine = hub.get(None)[0]
    model = getattr(engine.adapter, "model", None)
    device = getattr(model, "device", None)
    on, refused = compile_choice(args.compile, getattr(device, "type", "cpu"), on_zero_gpu())
    if on and not engine.adapter.batch_decoding:
        on, refused = False, "This model has no batched decoder, so answers run on the plain path."
    if refused:
        print(refused, flush=True)
    if not on:
        return None
    example = next((e for e in load_examples() if e["kind"] == "image"), None)
    media, prompt = (example["path"], example["prompt"]) if example else (None, "")
    return WarmUp(engine, media, prompt, DEFAULT_METHODS, DEFAULT_SHARE / 100, args.max_new_tokens,
                  on_change=lambda message: print(message, flush=True))


def hardware_note(hub) -> str:
    """On a Space serving a real model: why answers wait for Generate (components/hosting/space_default.py)."""
    from components.hosting.space_default import HARDWARE_NOTE, hardware, on_space

    return HARDWARE_NOTE[hardware()] if on_space() and hub.default != hub.fallback else ""


def main(argv=None) -> None:
    from components.hosting.server import serve
    from components.hosting.uploads import upload_app_kwargs
    from components.page.ui import launch_kwargs

    args = parse_args(argv)
    files = file_budget(args)
    demo = build(args, files)
    # every body is counted as it arrives (components/hosting/uploads.py): uploads under --files-mb, other
    # bodies under --max-body-kb, stalled ones stopped after --body-timeout-s
    demo.queue(default_concurrency_limit=4)
    app_kwargs = upload_app_kwargs(files, body_limits(args))
    if args.share or handler_wrapper() is not None:  # a share link's tunnel and ZeroGPU's hooks need launch()
        demo.launch(server_name=args.host, server_port=args.port, share=args.share,
                    state_session_capacity=args.max_sessions, app_kwargs=app_kwargs, **launch_kwargs(args.max_file_size))
        return
    # Gradio's documented mount on the app's own uvicorn, which times heads out and caps connections per address
    # (components/hosting/server.py); Gradio's state store reads its capacity when its app is made
    import fastapi
    import gradio as gr

    demo.state_session_capacity = args.max_sessions
    page = gr.mount_gradio_app(fastapi.FastAPI(), demo, path="/", server_name=args.host, server_port=args.port,
                               app_kwargs=app_kwargs, **launch_kwargs(args.max_file_size))
    serve(page, host=args.host, port=args.port, head_timeout_s=args.head_timeout_s,
          max_client_connections=client_connections(args))


def client_connections(args: argparse.Namespace) -> int:
    """The per-address connection cap: the flag, else 32 (0 on a Space: its proxy is every connection's address)."""
    from components.hosting.space_default import on_space

    if args.max_client_connections is not None:
        return int(args.max_client_connections)
    return 0 if on_space() else 32


if __name__ == "__main__":
    main()
