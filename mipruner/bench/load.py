"""`python -m mipruner.bench load`: the app under concurrent sessions, round after round.

Starts the app (`app.py` of this checkout, embedded model) on 127.0.0.1 in a child process, then
runs `--rounds` rounds. Each round opens `--sessions` new gradio_client sessions at once; each
encodes its own image (new scenes every round, from `mipruner.shapes.scenes`, so every round
brings new encodings, as new visitors would) and makes `--requests` requests: panel views at
changing budgets, and every fifth an answer. Before each round one lone session computes the
reference results for that round's images; a result that differs from the reference for the
session's own image is a cross-session mismatch (a leak). After each round it reports errors,
mismatches, p50/p95 request latency and the server's resident memory (RSS).

Loops are bounded: a fixed number of requests, a per-request timeout and a per-round deadline.
Done when: 0 errors, 0 mismatches, and RSS after the last round within 10% of the round before.

    python -m mipruner.bench load [--sessions 8] [--requests 10] [--rounds 3] [--server-arg=--cache-mb=64]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ["mi", "random", "similarity"]
BUDGETS = (8, 16, 32, 64, 24, 12)
MAX_NEW = 4
IMAGES_PER_ROUND = 4  # sessions share these, so sessions with the same image can be compared


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc; psutil elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def start_server(port: int, extra: list[str], log_path: str, timeout_s: float = 240.0) -> subprocess.Popen:
    """`python app.py` on 127.0.0.1:port; returns once the page answers (or raises with the log)."""
    app = os.path.join(ROOT, "app.py")
    if not os.path.exists(app):
        raise SystemExit(f"app.py not found next to the package ({ROOT}): run from a checkout of the repository")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("SPACE_ID", None)
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, app, "--host", "127.0.0.1", "--port", str(port),
                             "--max-new-tokens", str(MAX_NEW), *extra], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited ({proc.returncode}); log:\n" + open(log_path).read()[-3000:])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(1.0)
    proc.kill()
    raise SystemExit(f"the app did not answer within {timeout_s:.0f} s; log:\n" + open(log_path).read()[-3000:])


def round_images(out_dir: str, round_index: int) -> list[tuple[str, str]]:
    """(path, prompt) of this round's scenes: new images each round, a question about each."""
    from mipruner.shapes import questions as q
    from mipruner.shapes import scenes as sc

    rows, index = [], 0
    while len(rows) < IMAGES_PER_ROUND:
        scene = sc.make_scene(9_000 + round_index, index)
        index += 1
        if not scene.objects:
            continue
        path = os.path.join(out_dir, f"round{round_index}_{len(rows)}.png")
        scene.pil()[0].save(path)
        o = scene.objects[0]
        rows.append((path, q.presence_question(o.color, o.shape)))
    return rows


def schedule(j: int, n: int) -> list[tuple[str, int]]:
    """Session j's requests: ("view" | "generate", budget), n of them."""
    return [("generate" if i % 5 == 4 else "view", BUDGETS[(i + j) % len(BUDGETS)]) for i in range(n)]


class Session:
    """One gradio_client session that encodes one image and then views / answers."""

    def __init__(self, url: str, timeout_s: float):
        from gradio_client import Client

        self.client = Client(url, verbose=False, httpx_kwargs={"timeout": timeout_s})

    def encode(self, path: str, prompt: str) -> str:
        from gradio_client import handle_file

        status = self.client.predict(model="shapes-llava", model_path="", use="image", image=handle_file(path),
                                     video=None, prompt=prompt, api_name="/encode")[0]
        if "visual tokens" not in str(status):
            raise RuntimeError(f"encode did not report its tokens: {str(status)[:200]}")
        return status

    def request(self, kind: str, budget: int):
        """What a request returns that must not depend on other sessions: kept indices per method,
        or the answers' texts."""
        kw = dict(methods=METHODS, unit="tokens", budget=budget)
        if kind == "view":
            out = self.client.predict(**kw, api_name="/view")[-2]
            return [m["keep"] for m in out["methods"]]
        ans = self.client.predict(**kw, max_new_tokens=MAX_NEW, api_name="/generate")[-1]
        return [ans["reference"]["text"], *[ans["methods"][m]["text"] for m in METHODS]]


def reference(url: str, images, needs: dict, timeout_s: float) -> dict:
    """{(path, kind, budget): result} from one lone session, one image after the other.
    needs: path -> the (kind, budget) requests the sessions on that image will make."""
    ref = {}
    s = Session(url, timeout_s)
    for path, prompt in images:
        s.encode(path, prompt)
        for kind, b in sorted(needs[path]):
            ref[(path, kind, b)] = s.request(kind, b)
    return ref


def run_session(url: str, j: int, image, n: int, ref: dict, timeout_s: float) -> dict:
    out = {"latency_ms": [], "errors": [], "mismatches": 0}
    try:
        s = Session(url, timeout_s)
        t0 = time.perf_counter()
        s.encode(*image)
        out["latency_ms"].append((time.perf_counter() - t0) * 1e3)
    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
        out["errors"].append(f"session {j} encode: {type(e).__name__}: {str(e)[:200]}")
        return out
    for kind, b in schedule(j, n):
        t0 = time.perf_counter()
        try:
            got = s.request(kind, b)
        except Exception as e:  # noqa: BLE001
            out["errors"].append(f"session {j} {kind} b={b}: {type(e).__name__}: {str(e)[:200]}")
            continue
        out["latency_ms"].append((time.perf_counter() - t0) * 1e3)
        if got != ref[(image[0], kind, b)]:
            out["mismatches"] += 1
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def run(sessions: int, requests: int, rounds: int, server_args: list[str], timeout_s: float = 120.0,
        round_deadline_s: float = 900.0, log=print) -> dict:
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="mipruner-load-")
    proc = start_server(port, server_args, os.path.join(tmp, "server.log"))
    url = f"http://127.0.0.1:{port}/"
    report = {"sessions": sessions, "requests": requests, "server_args": server_args,
              "rss_start_mb": round(rss_mb(proc.pid), 1), "rounds": []}
    log(f"server pid {proc.pid} on {url}: RSS {report['rss_start_mb']:.0f} MiB at start")
    try:
        for r in range(rounds):
            images = round_images(tmp, r)
            needs = {path: set() for path, _ in images}
            for j in range(sessions):
                needs[images[j % len(images)][0]].update(schedule(j, requests))
            ref = reference(url, images, needs, timeout_s)
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(sessions) as pool:
                futs = [pool.submit(run_session, url, j, images[j % len(images)], requests, ref, timeout_s)
                        for j in range(sessions)]
                done, late = cf.wait(futs, timeout=round_deadline_s)
            results = [f.result() for f in done]
            lat = [x for res in results for x in res["latency_ms"]]
            errors = [e for res in results for e in res["errors"]]
            errors += [f"{len(late)} sessions past the deadline"] if late else []
            time.sleep(1.0)
            row = {"round": r + 1, "requests": len(lat), "errors": len(errors),
                   "mismatches": sum(res["mismatches"] for res in results),
                   "p50_ms": round(pct(lat, 0.5), 1), "p95_ms": round(pct(lat, 0.95), 1),
                   "wall_s": round(time.perf_counter() - t0, 1), "rss_mb": round(rss_mb(proc.pid), 1),
                   "first_errors": errors[:3]}
            report["rounds"].append(row)
            log(f"round {r + 1}: {row['requests']} requests in {row['wall_s']} s, errors {row['errors']}, "
                f"mismatches {row['mismatches']}, p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms, "
                f"RSS {row['rss_mb']:.0f} MiB" + "".join(f"\n    {e}" for e in errors[:3]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    rs = [row["rss_mb"] for row in report["rounds"]]
    report["last_vs_previous_rss"] = round(rs[-1] / rs[-2] - 1, 4) if len(rs) >= 2 else None
    report["ok"] = (all(row["errors"] == 0 and row["mismatches"] == 0 for row in report["rounds"])
                    and (report["last_vs_previous_rss"] is None or report["last_vs_previous_rss"] <= 0.10))
    return report


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mipruner.bench load", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions per round (default 8)")
    p.add_argument("--requests", type=int, default=10, help="requests per session after its encode (default 10)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of new sessions (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    p.add_argument("--server-arg", action="append", default=[], help="extra app.py argument (repeat; use =)")
    p.add_argument("--json", default="", help="also write the report here")
    a = p.parse_args(argv)
    if min(a.sessions, a.requests, a.rounds) < 1:
        p.error("--sessions, --requests and --rounds must be >= 1")
    rep = run(a.sessions, a.requests, a.rounds, a.server_arg, timeout_s=a.timeout)
    rs = " -> ".join(f"{row['rss_mb']:.0f}" for row in rep["rounds"])
    print(f"RSS MiB: start {rep['rss_start_mb']:.0f} -> {rs}; last round vs previous "
          f"{100 * (rep['last_vs_previous_rss'] or 0):+.1f}%  {'OK' if rep['ok'] else 'NOT OK'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
