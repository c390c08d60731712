"""Workers found by DNS on MinerU 4.0: dnsmasq on loopback names the patched ``mineru-router``'s
remote ``mineru-api`` workers (flash tier, text PDFs), on 127.0.0.2 to .6 and one port.

With a stream of jobs running, the name answers 2 workers, then 5, then 1 (hosts file
rewritten, SIGHUP). Every job completes; no healthy worker is ejected; the new workers take
jobs; the four gone from the answer get no new job once drained, are forgotten once their jobs
ended (their files copied to the router), and once those four are stopped every job's result
is still downloadable through the router, theirs included.
Runs when ``MINERU_HEALTH_MINERU4_PYTHON`` names a MinerU 4.0 environment's Python. Waits
are bounded; nothing asserts on timings.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from harness.dns import ADDRESSES, Dns
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import FLEET4_ENV, HOST, LINE4, Client, Router, Stream, text_document
from mineru_health.demo.sandbox import ManagedProcess, Processes, free_port, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sandbox.mineru4_python() is None,
        reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python",
    ),
]

NAME = "workers4.mineru-health.test"
WAIT_S = 180.0
JOBS_PATH = "POST /v1/parse/jobs"  # what the router sends a worker for each job


def _worker(
    procs: Processes, site: Path, python: str, scratch: Path, address: str, port: int
) -> ManagedProcess:
    scratch.mkdir(parents=True, exist_ok=True)
    argv = sandbox.mineru4_api_command(
        python, port, scratch / "uploads", tier=LINE4.tier, host=address
    )
    proc = procs.start(
        f"mineru-api-4-{address}",
        argv,
        env=LINE4.env(site, scratch, python, {}),
        log_path=scratch / "mineru-api.log",
        cwd=scratch,
    )
    proc.base_url = f"http://{address}:{port}"
    return proc


def _jobs_taken(worker: ManagedProcess, scratch: Path) -> int:
    return (scratch / "mineru-api.log").read_text(errors="replace").count(JOBS_PATH)


def _stop(proc: ManagedProcess) -> None:
    """Ends a worker as a scaled-down pod ends (SIGTERM to its process group)."""
    os.killpg(proc.pid, signal.SIGTERM)
    if proc.wait(30.0) is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10.0)


def test_workers_scaled_by_dns_under_load_lose_no_job(tmp_path: Path) -> None:
    python = sandbox.mineru4_python()
    assert python is not None
    site = sandbox.patched_site4(tmp_path / "mineru4-site", python)
    with Processes() as procs:
        dns = Dns(procs, tmp_path / "dns", NAME, ADDRESSES[:2])
        port = free_port()
        workers = {a: _worker(procs, site, python, tmp_path / a, a, port) for a in ADDRESSES}

        def up(proc: ManagedProcess) -> bool:
            if proc.poll() is not None:
                pytest.fail(f"{proc.base_url} exited:\n{proc.log_tail()}")
            try:
                return httpx.get(f"{proc.base_url}/v1/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(lambda: all(up(w) for w in workers.values()), WAIT_S, 0.3)

        scratch = tmp_path / "router"
        scratch.mkdir()
        router_port = free_port()
        env = {
            **FLEET4_ENV,
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(scratch / "audit.jsonl"),
            "MINERU_ROUTER_HEALTH_UPSTREAM_DNS": f"{NAME}:{port}",
            "MINERU_ROUTER_HEALTH_DNS_SERVERS": dns.servers,
            "MINERU_ROUTER_HEALTH_DNS_INTERVAL_S": "0.5",
        }
        proc = procs.start(
            "mineru-router",
            LINE4.router_argv(python, router_port, "none"),
            env=LINE4.env(site, scratch, python, env),
            log_path=scratch / "router.log",
            cwd=scratch,
        )
        proc.base_url = f"http://{HOST}:{router_port}"
        router = Router(LINE4, proc, scratch, 2)
        router.wait_in_rotation(WAIT_S)

        def forgotten(*ids: str) -> bool:
            done = {
                r["worker_id"] for r in router.audit_records() if r["action"] == "worker_forgotten"
            }
            return set(ids) <= done

        client = Client(router.base, LINE4)
        drained = ADDRESSES[:-1]
        with Stream(client, text_document, every_s=0.4, count=30) as stream:
            stream.wait_submitted(5, WAIT_S)
            dns.reload(ADDRESSES)  # 2 -> 5
            assert wait_until(lambda: router.routable() == 5, WAIT_S, 0.3), proc.log_tail()
            stream.wait_submitted(18, WAIT_S)
            dns.reload(ADDRESSES[-1:])  # 5 -> 1: the four others drained at once
            assert wait_until(lambda: router.routable() == 1, WAIT_S, 0.2), proc.log_tail()
            taken_when_drained = {a: _jobs_taken(workers[a], tmp_path / a) for a in drained}
            assert wait_until(lambda: forgotten(*(f"dns-{a}" for a in drained)), WAIT_S, 0.3), (
                proc.log_tail()
            )
            outcomes = stream.outcomes(WAIT_S)

        bad = [(o.number, o.status, o.detail) for o in outcomes if o.status != "completed"]
        assert not bad, (bad, proc.log_tail(6000))
        assert len(outcomes) == 30
        taken = {a: _jobs_taken(workers[a], tmp_path / a) for a in ADDRESSES}
        assert all(taken[a] > 0 for a in ADDRESSES[2:]), taken  # the workers added took jobs
        # Drained: no job sent there after the drain (one in flight at that moment at most).
        for address in drained:
            assert taken[address] <= taken_when_drained[address] + 1, (taken, taken_when_drained)
        # The drained workers' pods go: their files are the router's copies now.
        for address in drained:
            _stop(workers[address])
        with httpx.Client(base_url=router.base, timeout=30) as http:
            for job in outcomes:
                output = job.detail["files"][0]["output_files"]["markdown"]
                content = http.get(f"/v1/files/{output['file_id']}/content")
                assert content.status_code == 200, (job.number, content.text[:300])
                assert f"Document {job.number}," in content.text

        records = router.audit_records()
        assert not [r for r in records if r["action"] == "ejected"], records
        actions = {(r["action"], r["worker_id"]) for r in records}
        for address in drained:
            assert ("worker_draining", f"dns-{address}") in actions
        for address in ADDRESSES[2:]:
            assert ("worker_admitted", f"dns-{address}") in actions
        copied = [r["reason"] for r in records if r["action"] == "worker_forgotten"]
        assert len(copied) == 4 and all("not copied" not in c for c in copied), copied
        assert any(" 0 finished result(s)" not in c for c in copied), copied
