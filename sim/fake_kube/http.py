"""The HTTP face: discovery documents (what kubectl reads first), paths to the store's verbs, and the server thread."""

from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from sim.fake_kube.errors import ApiError
from sim.fake_kube.selectors import field_matches, label_matches
from sim.fake_kube.store import API_VERSION, KIND_BY_PLURAL, RESOURCES, FakeKube
from sim.fake_kube.table import table, wants_table
from sim.local_http import LocalHttpServer

# --- discovery -----------------------------------------------------------------------------------
# What clients such as kubectl read before they act (the legacy discovery documents; a client that
# asks for aggregated discovery gets these and falls back, as it does with an older API server).
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resource(name: str, kind: str, namespaced: bool, short: list[str] | None = None, verbs=None, **extra) -> dict:
    return {"name": name, "singularName": "" if "/" in name else kind.lower(), "namespaced": namespaced,
            "kind": kind, "verbs": verbs or _VERBS, **({"shortNames": short} if short else {}), **extra}


DISCOVERY = {
    "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0-gpuheal-fake", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": group, "versions": [{"groupVersion": f"{group}/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": f"{group}/v1", "version": "v1"}} for group in ("apps", "policy")] + [
        {"name": "cluster.x-k8s.io", "versions": [{"groupVersion": "cluster.x-k8s.io/v1beta1", "version": "v1beta1"}],
         "preferredVersion": {"groupVersion": "cluster.x-k8s.io/v1beta1", "version": "v1beta1"}}]},
    "/apis/cluster.x-k8s.io/v1beta1": {"kind": "APIResourceList", "apiVersion": "v1",
                                       "groupVersion": "cluster.x-k8s.io/v1beta1", "resources": [
        _resource("machines", "Machine", True, ["ma"]),
        _resource("machinesets", "MachineSet", True, ["ms"]),
    ]},
    "/apis/apps/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1", "resources": [
        _resource("daemonsets", "DaemonSet", True, ["ds"]),
    ]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("nodes", "Node", False, ["no"]),
        _resource("nodes/status", "Node", False, verbs=["get", "patch", "update"]),
        _resource("pods", "Pod", True, ["po"]),
        _resource("pods/status", "Pod", True, verbs=["get", "patch", "update"]),
        _resource("pods/eviction", "Eviction", True, verbs=["create"], group="policy", version="v1"),
        _resource("namespaces", "Namespace", False, ["ns"]),
        _resource("events", "Event", True, ["ev"]),
    ]},
    "/apis/policy/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "policy/v1", "resources": [
        _resource("poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"]),
    ]},
}


# --- HTTP ----------------------------------------------------------------------------------------
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/policy/v1|/apis/apps/v1|/apis/cluster\.x-k8s\.io/v1beta1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|eviction))?$"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the real API server's Go net/http sets on every connection: with Nagle's
    # algorithm the response's headers and body (two writes) waited on the client's delayed ACK,
    # about 40 ms on every call (storm bench, 2026-12-06).
    disable_nagle_algorithm = True
    kube: FakeKube

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self):
        # Always read the whole body: a leftover on a keep-alive connection corrupts the next request.
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _send(self, code: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, verb: str) -> None:
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError):
            return self._send(400, ApiError(400, "BadRequest", "request body is not JSON").status())
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.kube.requests.append((verb, url.path, url.query))
        fault = self.kube.fault_for(verb, url.path)
        if fault is not None:
            if fault.latency_s:
                time.sleep(fault.latency_s)
            if fault.status:
                reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                          403: "Forbidden"}.get(fault.status, "InternalError")
                return self._send(fault.status, ApiError(fault.status, reason, f"injected {fault.status}").status())
        try:
            self._route(verb, url.path, q, body)
        except ApiError as err:
            self._send(err.code, err.status())
        except (KeyError, TypeError, ValueError, IndexError) as err:
            self._send(422, ApiError(422, "Invalid", f"invalid request: {err}").status())
        if fault is not None and fault.after is not None:
            fault.after()

    def _route(self, verb: str, path: str, q: dict, body) -> None:
        m = _PATH.match(path)
        if m is None or m["plural"] not in KIND_BY_PLURAL and not (m["plural"] == "namespaces"):
            if path in DISCOVERY:
                return self._send(200, DISCOVERY[path])
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        kind = KIND_BY_PLURAL[m["plural"]]
        if RESOURCES[kind][0] != m["prefix"]:  # machines under /api/v1, say: no such resource there
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns, name, sub = m["ns"], m["name"], m["sub"]
        if kind == "Namespace" and ns and not name:
            name, ns = ns, None
        k = self.kube
        as_table = verb == "GET" and not sub and wants_table(self.headers.get("Accept"))
        if verb == "GET" and name:
            obj = k.get(kind, ns or "", name)
            return self._send(200, table(kind, [obj]) if as_table else obj)
        if verb == "GET":
            if (q.get("watch") or "").lower() in ("true", "1"):
                return self._watch(kind, ns, q, as_table)
            items = k.list(kind, ns, q.get("labelSelector"), q.get("fieldSelector"))
            if as_table:
                return self._send(200, table(kind, items, str(k.rv)))
            return self._send(200, {"kind": f"{kind}List", "apiVersion": API_VERSION[kind],
                                    "metadata": {"resourceVersion": str(k.rv)}, "items": items})
        if verb == "POST" and sub == "eviction":
            return self._send(201, k.evict(ns, name, body or {}))
        if verb == "POST":
            return self._send(201, k.put(kind, body or {}, ns))
        if verb == "PUT":
            return self._send(200, k.replace(kind, ns or "", name, body or {}, sub))
        if verb == "PATCH":
            return self._send(200, k.patch(kind, ns or "", name, body, self.headers.get("Content-Type", ""), sub))
        if verb == "DELETE":
            grace = (body or {}).get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            return self._send(200, k.delete(kind, ns or "", name, int(grace) if grace is not None else None))
        raise ApiError(405, "MethodNotAllowed", f"{verb} not supported on {path}")

    def _watch(self, kind: str, ns: str | None, q: dict, as_table: bool = False) -> None:
        k = self.kube
        since = int(q.get("resourceVersion") or k.rv)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 30)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(doc: dict) -> None:
            data = (json.dumps(doc) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            with k.lock:
                oldest = k.log[0][0] if k.log else k.rv
            if since and since < oldest - 1:
                chunk({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                   "message": f"too old resource version: {since} ({oldest})",
                                                   "reason": "Expired", "code": 410}})
            else:
                while time.monotonic() < deadline:
                    with k.lock:
                        fresh = [(rv, t, o) for rv, t, kk, o in k.log if rv > since and kk == kind
                                 and (ns is None or o["metadata"].get("namespace") == ns)
                                 and label_matches(o["metadata"].get("labels") or {}, q.get("labelSelector"))
                                 and field_matches(o, q.get("fieldSelector"))]
                        if not fresh:
                            k.changed.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                            continue
                    for rv, t, o in fresh:
                        chunk({"type": t, "object": table(kind, [o]) if as_table else o})
                        since = rv
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self):  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")


class FakeKubeServer(LocalHttpServer):
    """FakeKube on 127.0.0.1:<port>, in a thread. `configuration()` gives a kubernetes client config."""

    def __init__(self, kube: FakeKube | None = None, port: int = 0):
        self.kube = kube or FakeKube()
        super().__init__(type("Handler", (_Handler,), {"kube": self.kube}), "fake-kube", port)

    def stop(self) -> None:
        super().stop()
        self.kube.close()

    def write_kubeconfig(self, path) -> str:
        """A kubeconfig pointing at this server, for code that loads config the standard way."""
        from pathlib import Path

        Path(path).write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{self.url}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: fake, user: u}}}}]
current-context: c
""")
        return str(path)

    def configuration(self):
        from kubernetes import client

        from activities.kube_client import CLUSTER_CALL_THREADS

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.connection_pool_maxsize = CLUSTER_CALL_THREADS
        return cfg

    def api_client(self):
        """The real `kubernetes` client's ApiClient, pointed at this server."""
        from kubernetes import client

        return client.ApiClient(self.configuration())
