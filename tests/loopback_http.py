"""A threaded HTTP server on 127.0.0.1 for tests that play a remote service (the sandbox's http backend)."""

from __future__ import annotations

import socketserver
from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` bound to 127.0.0.1 without the host-name lookup (seconds without DNS),
    and quiet when a client goes away mid-answer (the slow and capped answers' clients do, by design)."""

    daemon_threads = True

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request, client_address):
        pass
