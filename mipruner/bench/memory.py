"""`python -m mipruner.bench memory`: does the app's memory level off however many sessions come and go?

Starts the app (`app.py` of this checkout, the embedded model) on 127.0.0.1 in a child process with the caps given
(`--cache-mb`, `--files-mb`, `--max-sessions`), then serves `--sessions` new gradio_client sessions, `--concurrency`
at a time. Each session is a new visitor: it encodes its own medium (an image: a new scene per session; a video: the
example clip with a prompt of its own, so every session is a new encoding), moves the budget `--views` times (panels
drawn) and asks for the answers once. After every wave (and `--settle` seconds) the server's resident memory (RSS,
/proc) is sampled, and its peak during the wave (every 0.25 s). The verdict reads the last third of the settled
samples (at least 3 of at least 6): it levels off when their highest is within `--tolerance` (5%) of their lowest. The server is measured from outside (its own process, the clients in this one), so RSS is what a host sees.

A session whose encoding was evicted by the byte cap while it was still working (tight caps, many at once) gets the
app's "press Run again": those are counted as `evicted`, other failures as `errors`.

    python -m mipruner.bench memory --media image --sessions 96 --cache-mb 64 --files-mb 64 --max-sessions 16
    python -m mipruner.bench memory --media video --sessions 48 --concurrency 2
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import tempfile
import threading
import time

from .cli import command_parser, write_json
from .load import free_port, rss_mb, start_server

METHODS = ["mi", "random", "similarity"]
IMAGE_BUDGETS = (8, 16, 32, 12, 24, 40)  # tokens, of the embedded model's 196 per image
VIDEO_BUDGETS = (200, 400, 300, 250, 600, 350)  # tokens, of the example clip's 1,568
MAX_NEW = 4
CLIP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "assets", "examples", "clip_0.mp4")


def levels_off(samples: list[float], tolerance: float = 0.05) -> tuple[bool, float]:
    """(whether the last third of `samples` stays within `tolerance` of its lowest, that spread: max/min - 1)."""
    if len(samples) < 6:
        raise ValueError(f"samples: need at least 6 to judge a last third, got {len(samples)}")
    tail = samples[-max(3, -(-len(samples) // 3)):]
    spread = max(tail) / min(tail) - 1.0
    return spread <= tolerance, spread


def scene_path(out_dir: str, i: int) -> str:
    """A new scene of the embedded model's world for session i, written once as a PNG."""
    from mipruner.shapes import scenes as sc

    path = os.path.join(out_dir, f"scene{i}.png")
    if not os.path.exists(path):
        sc.make_scene(11_000, i).pil()[0].save(path)
    return path


def visit(url: str, media: str, i: int, views: int, out_dir: str, timeout_s: float) -> dict:
    """One visitor: encode, `views` budget moves, one answer. {"evicted": n, "errors": [sentences]}."""
    from gradio_client import Client, handle_file

    out = {"evicted": 0, "errors": []}

    def call(what, **kw):
        try:
            return client.predict(**kw)
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            if "expired from the cache" in str(e):
                out["evicted"] += 1
            else:
                out["errors"].append(f"session {i} {what}: {type(e).__name__}: {str(e)[:160]}")
            return None

    try:
        client = Client(url, verbose=False, httpx_kwargs={"timeout": timeout_s})
    except Exception as e:  # noqa: BLE001
        out["errors"].append(f"session {i} connect: {type(e).__name__}: {str(e)[:160]}")
        return out
    if media == "image":
        enc = call("encode", model="shapes-llava", model_path="", use="image", image=handle_file(scene_path(out_dir, i)),
                   video=None, prompt="is there a red circle?", api_name="/encode")
        budgets = IMAGE_BUDGETS
    else:
        enc = call("encode", model="shapes-llava", model_path="", use="video", image=None, video=handle_file(CLIP),
                   prompt=f"what is moving in clip {i}?", api_name="/encode")
        budgets = VIDEO_BUDGETS
    if enc is None:
        return out
    for v in range(views):
        call("view", methods=METHODS, unit="tokens", budget=budgets[(i + v) % len(budgets)], api_name="/view")
    call("generate", methods=METHODS, unit="tokens", budget=budgets[i % len(budgets)], max_new_tokens=MAX_NEW,
         api_name="/generate")
    return out


def watch(pid: int, stop, every_s: float = 0.25) -> float:
    """The highest RSS (MiB) of process `pid` until `stop` is set, sampled every `every_s` seconds."""
    peak = rss_mb(pid)
    while not stop.wait(every_s):
        peak = max(peak, rss_mb(pid))
    return max(peak, rss_mb(pid))


def run(media: str, sessions: int, concurrency: int, views: int, server_args: list[str], timeout_s: float = 300.0,
        tolerance: float = 0.05, settle_s: float = 6.0, log=print) -> dict:
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="mipruner-memory-")
    proc = start_server(port, ["--compile", "off", *server_args], os.path.join(tmp, "server.log"))
    url = f"http://127.0.0.1:{port}/"
    report = {"media": media, "sessions": sessions, "concurrency": concurrency, "views": views,
              "server_args": server_args, "rss_start_mb": round(rss_mb(proc.pid), 1), "waves": []}
    log(f"server pid {proc.pid} on {url} ({' '.join(server_args) or 'default caps'}): RSS "
        f"{report['rss_start_mb']:.0f} MiB at start")
    try:
        done = 0
        while done < sessions:
            n = min(concurrency, sessions - done)
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(n + 1) as pool:
                peak = pool.submit(watch, proc.pid, stop := threading.Event())
                got = list(pool.map(lambda i: visit(url, media, i, views, tmp, timeout_s), range(done, done + n)))
                time.sleep(settle_s)
                stop.set()
            done += n
            row = {"sessions": done, "rss_mb": round(rss_mb(proc.pid), 1), "peak_mb": round(peak.result(), 1),
                   "wall_s": round(time.perf_counter() - t0, 1),
                   "evicted": sum(g["evicted"] for g in got), "errors": [e for g in got for e in g["errors"]]}
            report["waves"].append(row)
            log(f"{done:>4} sessions: RSS {row['rss_mb']:.0f} MiB, peak {row['peak_mb']:.0f} ({row['wall_s']} s; evicted {row['evicted']}, "
                f"errors {len(row['errors'])})" + "".join(f"\n    {e}" for e in row["errors"][:2]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except Exception:  # noqa: BLE001
            proc.kill()
    rss = [w["rss_mb"] for w in report["waves"]]
    report["errors"] = sum(len(w["errors"]) for w in report["waves"])
    report["evicted"] = sum(w["evicted"] for w in report["waves"])
    if len(rss) >= 6:
        report["levels_off"], spread = levels_off(rss, tolerance)
        report["last_third_spread"] = round(spread, 4)
    else:
        report["levels_off"], report["last_third_spread"] = None, None
    report["ok"] = bool(report["levels_off"]) and report["errors"] == 0
    return report


def main(argv=None) -> int:
    p = command_parser("memory", __doc__)
    p.add_argument("--media", choices=("image", "video"), default="image", help="what each session encodes")
    p.add_argument("--sessions", type=int, default=96, help="new sessions in all (default 96)")
    p.add_argument("--concurrency", type=int, default=8, help="sessions at once, one wave (default 8)")
    p.add_argument("--views", type=int, default=6, help="budget moves per session (default 6)")
    p.add_argument("--cache-mb", type=int, default=None, help="the app's --cache-mb (default: the app's)")
    p.add_argument("--files-mb", type=int, default=None, help="the app's --files-mb (default: the app's)")
    p.add_argument("--max-sessions", type=int, default=None, help="the app's --max-sessions (default: the app's)")
    p.add_argument("--tolerance", type=float, default=0.05, help="the last third's allowed spread (default 0.05)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    p.add_argument("--settle", type=float, default=6.0, help="seconds after a wave before its RSS sample (default 6:"
                   " past the app's 5 s release interval); the wave's peak is sampled throughout")
    p.add_argument("--json", default="", help="also write the report here")
    a = p.parse_args(argv)
    if min(a.sessions, a.concurrency) < 1 or a.views < 0:
        p.error("--sessions and --concurrency must be >= 1, --views >= 0")
    if a.sessions < 6 * a.concurrency:
        p.error("--sessions must be at least 6 x --concurrency (six RSS samples, one per wave)")
    server = [f"--{k.replace('_', '-')}={v}" for k, v in (("cache_mb", a.cache_mb), ("files_mb", a.files_mb),
                                                          ("max_sessions", a.max_sessions)) if v is not None]
    rep = run(a.media, a.sessions, a.concurrency, a.views, server, timeout_s=a.timeout, tolerance=a.tolerance,
              settle_s=a.settle)
    rss = " -> ".join(f"{w['rss_mb']:.0f}" for w in rep["waves"])
    print(f"RSS MiB: start {rep['rss_start_mb']:.0f} -> {rss}; last third within "
          f"{100 * (rep['last_third_spread'] or 0):.1f}% (tolerance {100 * a.tolerance:.0f}%); "
          f"{'LEVELS OFF' if rep['levels_off'] else 'DOES NOT LEVEL OFF'}; evicted {rep['evicted']}, errors {rep['errors']}")
    write_json(a.json, rep)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
