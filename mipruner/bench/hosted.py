"""A hosted launch of the app for the attack benchmark (`mipruner.bench.attacks`): `app.py` of this checkout as a
CPU Space starts it, its API called by name with raw queue calls (any session hash, any address), and a
visitor's Run (encode the example picture, view its panels) in a new session."""
from __future__ import annotations

import json
import os
import sys
import time
import uuid

from .load import ROOT, free_port, rss_mb

EXAMPLE = os.path.join(ROOT, "assets", "examples", "scene_0.png")
FILES_MB = 64


class Server:
    """app.py as a CPU Space, with the attacks' caps; `.url`, `.port`, `.folder` (Gradio's upload folder)."""

    def __init__(self, tmp: str, head_s: float, body_s: float):
        import subprocess

        self.port, self.folder = free_port(), os.path.join(tmp, "gradio-mipruner")
        env = {**os.environ, "SPACE_ID": "someone/mipruner", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TMPDIR": tmp, "HF_HOME": os.path.join(tmp, "hf"), "MIPRUNER_MODEL": "shapes-llava",
               "GRADIO_ANALYTICS_ENABLED": "False"}
        args = ["--port", str(self.port), "--files-mb", str(FILES_MB), "--body-timeout-s", str(body_s),
                "--head-timeout-s", str(head_s), "--max-client-requests", "24", "--compile", "off"]
        self.log = os.path.join(tmp, "server.log")
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "app.py"), *args], cwd=ROOT, env=env,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/"
        import httpx

        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.url + "config", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise SystemExit("the app did not start; log:\n" + open(self.log).read()[-3000:])
            time.sleep(1)
        info = httpx.get(self.url + "gradio_api/info", timeout=30).json()["named_endpoints"]
        self.defaults = {api: [p.get("parameter_default") for p in info[f"/{api}"]["parameters"]]
                         for api in ("encode", "view", "settings")}
        self.params = {api: [p["parameter_name"] for p in info[f"/{api}"]["parameters"]] for api in self.defaults}
        deps = httpx.get(self.url + "config", timeout=30).json()["dependencies"]
        self.fn = {d.get("api_name"): d.get("id", i) for i, d in enumerate(deps)}

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def disk_mb(self) -> float:
        total = 0
        for d, dirs, files in os.walk(self.folder):
            for n in dirs + files:
                try:
                    total += os.stat(os.path.join(d, n), follow_symlinks=False).st_blocks * 512
                except OSError:
                    pass
        return total / 2**20

    def join(self, api: str, values: dict, session: str, client, timeout: float = 120) -> str | None:
        """Queue a call of the API `api` (its defaults, `values` by name) in `session`: its event id, or None
        when the server refused it."""
        data = list(self.defaults[api])
        for k, v in values.items():
            data[self.params[api].index(k)] = v
        body = {"data": [None, *data], "fn_index": self.fn[api], "session_hash": session, "event_data": None,
                "trigger_id": None}
        r = client.post(self.url + "gradio_api/queue/join", json=body, timeout=timeout)
        return r.json()["event_id"] if r.status_code == 200 else None

    def collect(self, session: str, events: list[str], client, timeout: float = 120) -> dict:
        """Read the session's one stream until every event in `events` completed: event -> (success, data or
        error)."""
        out, left = {}, set(events)
        with client.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": session},
                           timeout=timeout) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    msg = json.loads(line[5:])
                    if msg.get("event_id") in left and msg.get("msg") == "process_completed":
                        got = msg.get("output") or {}
                        out[msg["event_id"]] = (bool(msg.get("success")),
                                                got.get("data") if msg.get("success") else got.get("error"))
                        left.discard(msg["event_id"])
                        if not left:
                            break
        return out

    def call(self, api: str, values: dict, session: str, client=None, timeout: float = 120) -> tuple[bool, object]:
        """A queued call of the API `api` in `session`: (success, data or the error sentence)."""
        import httpx

        own = client is None
        client = client or httpx.Client(timeout=timeout)
        try:
            event = self.join(api, values, session, client, timeout)
            if event is None:
                return False, "refused"
            return self.collect(session, [event], client, timeout).get(event, (False, "no answer"))
        finally:
            if own:
                client.close()

    def run(self) -> float:
        """The second visitor's Run in a new session: encode the example picture, view its panels; seconds."""
        session = uuid.uuid4().hex[:11]
        t0 = time.perf_counter()
        ok, out = self.call("encode", {"image": {"path": EXAMPLE, "meta": {"_type": "gradio.FileData"}},
                                       "prompt": "is there a red circle?"}, session)
        ok = ok and self.call("view", {}, session)[0]
        if not ok:
            raise RuntimeError(f"the visitor's Run failed: {str(out)[:200]}")
        return time.perf_counter() - t0


__all__ = ["EXAMPLE", "FILES_MB", "Server"]
