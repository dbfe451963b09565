"""A fault-injecting HTTP proxy in front of moto: what a flaky AWS endpoint looks like to boto3.

Point a client's endpoint_url at `proxy.url`. A share of requests (`rate`) is refused before it
reaches moto, as 500 InternalError, 503 throttling, or a dropped connection after a delay (a
timeout); the rest are forwarded. Every request is recorded with its AWS action, so tests can
count the calls that must happen once (RebootInstances, TerminateInstances).
"""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import requests

from sim.local_http import LocalHttpServer

_ERRORS = {
    500: b"<Response><Errors><Error><Code>InternalError</Code><Message>injected</Message></Error></Errors></Response>",
    503: b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>injected</Message></Error></Errors></Response>",
}


@dataclass
class ProxiedCall:
    action: str
    instance_ids: list[str]
    outcome: str  # forwarded, 500, 503, dropped
    at: float = field(default_factory=time.time)


class AwsFaultProxy(LocalHttpServer):
    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 7, drop_delay_s: float = 0.5):
        self.upstream, self.rate, self.drop_delay_s = upstream.rstrip("/"), rate, drop_delay_s
        self.random = random.Random(seed)
        self.calls: list[ProxiedCall] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.handle(self, body)

            do_GET = do_POST  # noqa: N815

        super().__init__(Handler, "aws-fault-proxy")

    def count(self, action: str, instance_id: str | None = None, outcome: str = "forwarded") -> int:
        with self.lock:
            return sum(c.action == action and c.outcome == outcome and (instance_id is None or instance_id in c.instance_ids)
                       for c in self.calls)

    def handle(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        form = urllib.parse.parse_qs(body.decode(errors="replace"))
        target = h.headers.get("X-Amz-Target", "")  # JSON protocols (SSM) name the action here
        action = (form.get("Action") or [target.rsplit(".", 1)[-1]])[0]
        ids = [v[0] for k, v in form.items() if k.startswith("InstanceId")]
        with self.lock:
            roll = self.random.random()
            kind = self.random.choice(["500", "503", "dropped"]) if roll < self.rate else "forwarded"
            self.calls.append(ProxiedCall(action, ids, kind))
        if kind == "dropped":
            time.sleep(self.drop_delay_s)
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if kind != "forwarded":
            payload = _ERRORS[int(kind)]
            h.send_response(int(kind))
            h.send_header("Content-Type", "text/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "content-length")}
        r = requests.request(h.command, self.upstream + h.path, data=body, headers=headers, timeout=30)
        h.send_response(r.status_code)
        for k, v in r.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(r.content)))
        h.end_headers()
        h.wfile.write(r.content)
