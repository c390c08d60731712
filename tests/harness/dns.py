"""A real DNS server for the tests of workers found by DNS: Debian's dnsmasq on loopback.

    dns = Dns(procs, scratch, "workers.mineru-health.test", ("127.0.0.2", "127.0.0.3"))
    env["MINERU_ROUTER_HEALTH_DNS_SERVERS"] = dns.servers
    dns.reload(("127.0.0.2", "127.0.0.3", "127.0.0.4"))   # the hosts file, read again (SIGHUP)

It answers the name from a hosts file only (``--no-resolv --no-hosts``; names under
``.test`` are its own, so another name is NXDOMAIN, not a forwarded query). Workers live
on loopback addresses of their own (127.0.0.2 to .6) and one port, as a headless
Service's pods do; :data:`ADDRESSES`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
from pathlib import Path

import pytest
from mineru_health.demo.sandbox import ManagedProcess, Processes, free_port

__all__ = ["ADDRESSES", "Dns", "dnsmasq"]

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")


def dnsmasq() -> str:
    """dnsmasq's path; skips the test where it is not installed."""
    for path in ("/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", shutil.which("dnsmasq") or ""):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("dnsmasq is not installed (Debian: dnsmasq-base)")


class Dns:
    """dnsmasq answering ``name`` with the addresses of a hosts file the test rewrites."""

    def __init__(
        self, procs: Processes, scratch: Path, name: str, addresses: tuple[str, ...]
    ) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.hosts = scratch / "hosts"
        self.port = free_port()
        self.servers = f"127.0.0.1:{self.port}"
        self._write(addresses)
        argv = [
            dnsmasq(),
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--conf-file=/dev/null",
            f"--addn-hosts={self.hosts}",
            "--local=/test/",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={self.port}",
            "--pid-file=",
            "--log-facility=-",
            # As this user: root's dnsmasq would drop to nobody, who cannot read tmp_path.
            f"--user={pwd.getpwuid(os.getuid()).pw_name}",
        ]
        self.proc: ManagedProcess = procs.start(
            "dnsmasq", argv, env=dict(os.environ), log_path=scratch / "dnsmasq.log", cwd=scratch
        )

    def _write(self, addresses: tuple[str, ...]) -> None:
        new = self.hosts.with_suffix(".new")
        new.write_text("".join(f"{address} {self.name}\n" for address in addresses))
        new.replace(self.hosts)

    def reload(self, addresses: tuple[str, ...]) -> None:
        """The name answers ``addresses`` from now on (dnsmasq reads its hosts file again)."""
        self._write(addresses)
        os.kill(self.proc.pid, signal.SIGHUP)
