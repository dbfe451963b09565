"""Mutual TLS in front of the Temporal dev server (which speaks only plaintext): a CA, certificates
for the server and for each client, and a proxy that ends TLS, requires a client certificate the CA
signed, and passes the HTTP/2 stream on. What a Temporal frontend with `requireClientAuth` does."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    """A throwaway CA under `dir`: ca.crt, and <name>.crt / <name>.key for each issued name."""

    dir: Path
    _key: ec.EllipticCurvePrivateKey = field(init=False)
    _cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuheal test CA")])
        self._cert = (self._builder(name, name, self._key.public_key())
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.ca = self.dir / "ca.crt"
        self.ca.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, server: bool = False) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), self._cert.subject,
                          key.public_key())
        b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        crt, pem = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        return crt, pem

    @staticmethod
    def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1)))


class MtlsProxy:
    """127.0.0.1:<port> with mutual TLS, forwarding to `upstream` (HOST:PORT) in plaintext, on a thread
    of its own. `refused` counts handshakes that failed (no client certificate, or an unknown CA)."""

    def __init__(self, pki: Pki, upstream: str):
        crt, key = pki.issue("temporal-frontend", server=True)
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
        self.ctx.load_cert_chain(crt, key)
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.set_alpn_protocols(["h2"])
        self.upstream = upstream
        self.refused = 0
        self.clients: list[str] = []  # the common name of each accepted client certificate
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> MtlsProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(self.ctx)
        except (ssl.SSLError, ConnectionError, OSError):
            self.refused += 1
            writer.close()
            return
        peer = writer.get_extra_info("peercert") or {}
        self.clients.append(next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), "?"))
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(Exception):
        dst.close()
