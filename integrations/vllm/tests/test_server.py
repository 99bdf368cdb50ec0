"""The OpenAI-compatible server: a request picks the method in its body; a bad one is HTTP 400 with
the plug-in's sentence, and the server answers the next request."""
from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import FAMILIES
from images import image

QUESTION = "what is in the image ?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    path, adapter = models["llava"]
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0",
           "--hf-overrides", json.dumps({"architectures": [FAMILIES["llava"][1]]}), "--trust-request-mm-kwargs",
           "--limit-mm-per-prompt", json.dumps({"image": 2, "video": 0})]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 420
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not start (exit {proc.poll()}); log: {log.name}")
            time.sleep(2)
        yield port, str(path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def body(model: str, **mm) -> dict:
    buf = io.BytesIO()
    image(56, 56, 0).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"model": model, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": QUESTION}]}],
            **({"mm_processor_kwargs": mm} if mm else {})}


def test_server_prunes_per_request_and_rejects_bad_ones(server, models):
    from test_anchor import reference

    port, model = server
    status, full = post(port, body(model))
    assert status == 200, full
    status, pruned = post(port, body(model, mipruner_method="similarity", mipruner_budget=8, mipruner_query=QUESTION))
    assert status == 200, pruned
    assert full["usage"]["prompt_tokens"] - pruned["usage"]["prompt_tokens"] == 16 - 8
    status, bad = post(port, body(model, mipruner_method="similarity", mipruner_budget=99, mipruner_query=QUESTION))
    assert status == 400, bad
    assert "mipruner_budget" in json.dumps(bad)
    status, again = post(port, body(model, mipruner_method="similarity", mipruner_budget=8, mipruner_query=QUESTION))
    assert status == 200, again
    assert again["choices"][0]["token_ids"] == pruned["choices"][0]["token_ids"]
    # the answer is mipruner's transformers path on the same kept tokens
    assert pruned["choices"][0]["token_ids"] == reference("llava", models["llava"][1], (56, 56, 0), "similarity", 8)[1]
