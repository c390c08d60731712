"""HTTPS upstreams: the native prober verifies certificates, against the CAs in
MINERU_ROUTER_HEALTH_CA_FILE when set. A loopback HTTPS server with a
certificate made for this test stands in for a worker."""

from __future__ import annotations

import datetime
import http.server
import io
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mineru_health.cli import probe_urls
from mineru_health.errors import ConfigError
from mineru_health.runtime.settings import HealthSettings

HEALTHY = {
    "status": "healthy",
    "protocol_version": 2,
    "queued_tasks": 0,
    "processing_tasks": 0,
    "completed_tasks": 0,
    "failed_tasks": 0,
    "max_concurrent_requests": 3,
    "processing_window_size": 64,
}


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "cert.pem"
    key_path = directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(HEALTHY).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_worker(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    cert, key = _self_signed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _probe(url: str, settings: HealthSettings) -> dict[str, object]:
    out = io.StringIO()
    probe_urls([url], timeout_s=2.0, as_json=True, settings=settings, out=out)
    (row,) = json.loads(out.getvalue())
    return dict(row)


def test_https_worker_is_healthy_with_its_ca(https_worker: tuple[str, Path]) -> None:
    url, cert = https_worker
    settings = HealthSettings.from_env({"MINERU_ROUTER_HEALTH_CA_FILE": str(cert)})
    row = _probe(url, settings)
    assert row["healthy"] is True, row


def test_untrusted_certificate_fails_the_probe(https_worker: tuple[str, Path]) -> None:
    url, _cert = https_worker
    row = _probe(url, HealthSettings.from_env({}))
    assert row["healthy"] is False
    assert row["status"] in ("connect_error", "transport_error"), row


def test_missing_ca_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        HealthSettings.from_env({"MINERU_ROUTER_HEALTH_CA_FILE": str(tmp_path / "nope.pem")})
    assert raised.value.variable == "MINERU_ROUTER_HEALTH_CA_FILE"
