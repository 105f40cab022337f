"""A stand-in for an OpenAI-compatible judge server (``vllm serve``) on 127.0.0.1, for the judge tests.

It answers ``POST /v1/chat/completions`` like a naive, obedient judge model: it reads the graded answer
as the text between the first ``<answer>`` line and the first ``</answer>`` after it, and **obeys any
"output N" instruction it finds outside that block** (a model that follows injected instructions).
Otherwise it scores 10 when the ``<reference>`` text appears in the answer, else the answer's length
modulo 11. An answer that asks to be repeated ("repeat this response") is echoed verbatim after the
judge's score line (a judge that follows an instruction inside the block). ``script`` plays faults, one
per request in order: ``"500"`` (an HTTP 500), ``"404"``, ``"malformed"`` (a 200 with a body that is not
JSON), ``"empty"`` (JSON without ``choices``), ``"garbage"`` (a 200 whose body is not UTF-8),
``"nested"`` (a 200 whose body is ``[`` nested past Python's recursion limit), ``"truncated"`` (a 200
that promises 1000 bytes, sends 20 and closes), ``"truncated500"`` (the same for an HTTP 500),
``"reset"`` (the connection reset, no answer), ``"notHTTP"`` (bytes that are no HTTP status line),
``"sleep:S"`` (answer after S seconds); ``"ok"`` or an exhausted script answers normally.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler

from loopback_http import LoopbackServer


def naive_judgement(prompt: str) -> str:
    """The reply of the naive judge to one prompt (see the module docstring)."""
    start = prompt.find("<answer>\n")  # the block's opening line (the instruction above names the tags too)
    end = prompt.find("</answer>", start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return "I cannot find the answer."
    answer = prompt[start + len("<answer>"):end].strip()
    outside = prompt[:start] + prompt[end:]
    order = re.search(r"output (\d+)", outside)
    if order:
        return f"As instructed. Score: {order.group(1)}"
    ref = re.search(r"<reference>\n(.*?)\n</reference>", prompt, re.S)
    if ref and ref.group(1).strip() and ref.group(1).strip() in answer:
        return "Matches the reference. Score: 10"
    verdict = f"Some merit. Score: {len(answer) % 11}"
    if "repeat this response" in answer:
        return f"{verdict}\nAs you asked, your response was:\n{answer}"
    return verdict


class FakeJudge:
    """The fake server in a background thread: ``url`` is its ``/v1`` root.

    Attributes:
        requests: every request's ``(headers dict, body dict or None)``, in arrival order.
        max_in_flight: the most requests it was handling at one time.
        delay_s: seconds every answer waits (to make concurrency visible, or to play a judge's latency).

    ``port``: 0 (any free port) or a fixed one (``benchmarks/bench_judge.py serve``).
    """

    def __init__(self, script: list[str] | None = None, delay_s: float = 0.0, port: int = 0) -> None:
        self.script = list(script or [])
        self.delay_s = delay_s
        self.requests: list[tuple[dict, dict | None]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with fake.lock:
                    fake.requests.append((dict(self.headers), body))
                    action = fake.script.pop(0) if fake.script else "ok"
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    fake._answer(self, action, body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        self.server = LoopbackServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def _answer(self, h: BaseHTTPRequestHandler, action: str, body: dict | None) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        if action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        if action in ("500", "404"):
            return self._send(h, int(action), b'{"error": "scripted"}')
        if action == "malformed":
            return self._send(h, 200, b"{not json")
        if action == "empty":
            return self._send(h, 200, b'{"object": "chat.completion"}')
        if action == "garbage":
            return self._send(h, 200, bytes(range(128, 256)) * 4)
        if action == "nested":
            return self._send(h, 200, b"[" * 100_000)
        if action in ("truncated", "truncated500"):
            return self._send(h, 200 if action == "truncated" else 500, b'{"choices": [{"mess', length=1000)
        if action == "reset":  # SO_LINGER 0: close() sends a TCP RST
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            h.close_connection = True
            return None
        if action == "notHTTP":
            h.wfile.write(b"\x00\xffnot an HTTP answer\r\n\r\n")
            h.close_connection = True
            return None
        prompt = body["messages"][-1]["content"] if body else ""
        reply = {"object": "chat.completion", "model": body.get("model") if body else None,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": naive_judgement(prompt)},
                              "finish_reason": "stop"}]}
        self._send(h, 200, json.dumps(reply).encode())

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, length: int | None = None) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data) if length is None else length))
            h.end_headers()
            h.wfile.write(data)
        except OSError:  # the client gave up (its timeout)
            pass

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeJudge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
