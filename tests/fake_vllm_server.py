"""A stand-in for vLLM's OpenAI server, for testing rlvr's vLLM engine without vLLM.

It answers the endpoints :mod:`rlvr.engines.vllm_engine` uses, the way vLLM 0.32 does (checked
against a real server: token ids in, ``token_ids`` + ``logprobs.token_logprobs`` out, the stop token
kept, ``finish_reason`` ``stop``/``length``, greedy refuses ``n > 1``). Generation is delegated to an
:class:`~rlvr.engines.hf.HFEngine` on the server's own copy of a model, and ``reload_weights`` loads
the safetensors file the client wrote — so weight sync can be checked end to end.

Every request is recorded in ``calls`` as ``(path, body, weights_checksum)``.

Run as a module (``python -m vllm.entrypoints.openai.api_server`` through a shim package, see
tests/engines/test_vllm_server.py) it serves ``/health`` only, and ``FAKE_VLLM_MODE`` selects
``ok`` / ``die`` (exit 3 during start-up) / ``hang`` (never healthy).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def checksum(model: Any) -> float:
    """A cheap fingerprint of a model's weights (sum of |w| over all parameters, float64)."""
    import torch  # noqa: F401  (lazy: the subprocess fake must start fast)

    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


class FakeVLLM:
    """The fake server, in a background thread of this process.

    Args:
        model: the served model (the fake's own copy; ``reload_weights`` overwrites it).
        tokenizer: its tokenizer.
        name: the served model name.
    """

    def __init__(self, model: Any = None, tokenizer: Any = None, name: str = "rlvr-policy") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.calls: list[tuple[str, Any, float | None]] = []
        self.paused = False
        self.fail_next: dict[str, int] = {}  # path -> HTTP status to answer once
        self.engine = None
        if model is not None:
            from rlvr.engines.hf import HFEngine

            self.engine = HFEngine(model, tokenizer)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = urllib.parse.urlparse(self.path).path
                if path == "/health":
                    return self._send(200, {})
                if path == "/v1/models":
                    return self._send(200, {"data": [{"id": fake.name}]})
                return self._send(404, {"error": "not found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                path = urllib.parse.urlparse(self.path).path
                code, obj = fake.handle(self.path, path, body)
                self._send(code, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "FakeVLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self) -> list[str]:
        """The recorded request paths, in order."""
        return [c[0] for c in self.calls]

    # ------------------------------------------------------------------------------------------
    def handle(self, full: str, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            self.calls.append((full, body, checksum(self.model) if self.model is not None else None))
            status = self.fail_next.pop(path, None)
        if status is not None:
            return status, {"error": {"message": f"injected failure on {path}"}}
        if path == "/v1/completions":
            if self.paused:
                return 503, {"error": {"message": "generation is paused"}}
            return self._complete(body)
        if path == "/pause":
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/reset_prefix_cache":
            return 200, {"success": True}
        if path == "/collective_rpc":
            if body.get("method") != "reload_weights":
                return 400, {"error": {"message": f"unknown method {body.get('method')}"}}
            import torch
            from safetensors.torch import load_file

            sd = load_file(os.path.join(body["kwargs"]["weights_path"], "model.safetensors"))
            with self.lock, torch.no_grad():
                missing, unexpected = self.model.load_state_dict(sd, strict=False)
            if unexpected or [m for m in missing if m != "lm_head.weight"]:
                return 500, {"error": {"message": f"missing {missing} unexpected {unexpected}"}}
            return 200, {"results": [None]}
        return 404, {"error": {"message": f"no route {path}"}}

    def _complete(self, body: dict[str, Any]) -> tuple[int, Any]:
        from rlvr.types import GenerationRequest, SamplingParams

        t = float(body.get("temperature", 1.0))
        if t == 0 and body.get("n", 1) != 1:
            return 400, {"error": {"message": f"n must be 1 when using greedy sampling, got {body['n']}."}}
        top_k = int(body.get("top_k") or -1)
        params = SamplingParams(
            temperature=t if t > 0 else 1.0, top_p=float(body.get("top_p", 1.0)),
            top_k=1 if t == 0 else (top_k if top_k > 0 else 0), max_new_tokens=int(body["max_tokens"]),
            seed=body.get("seed"),
        )
        saved = self.engine.eos_token_ids
        self.engine.eos_token_ids = set(body.get("stop_token_ids") or []) | saved
        try:
            with self.lock:
                gens = self.engine.generate([GenerationRequest(body["prompt"], n=int(body.get("n", 1)))], params)[0]
        finally:
            self.engine.eos_token_ids = saved
        choices = [
            {"index": j, "text": "", "token_ids": g.token_ids, "finish_reason": "stop" if g.finish_reason == "eos" else "length",
             "logprobs": {"token_logprobs": g.logprobs, "tokens": [f"token_id:{x}" for x in g.token_ids]}}
            for j, g in enumerate(gens)
        ]
        return 200, {"choices": choices, "model": self.name}


def main(argv: list[str]) -> int:  # pragma: no cover - runs as a subprocess
    """Entry point of the shim ``vllm.entrypoints.openai.api_server``: health only, by FAKE_VLLM_MODE."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args, _ = p.parse_known_args(argv)
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print(f"fake vLLM server starting, mode={mode}, argv={argv}", flush=True)
    if mode == "die":
        print("fatal: cannot load the model (injected)", flush=True)
        return 3
    if mode == "hang":
        while True:
            time.sleep(1)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()

    srv = ThreadingHTTPServer((args.host, args.port), H)
    pidfile = os.environ.get("FAKE_VLLM_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    srv.serve_forever()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
