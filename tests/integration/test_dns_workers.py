"""Workers found by DNS: a real DNS server (Debian's dnsmasq, on loopback) names the patched
3.x ``mineru-router``'s remote ``mineru-api`` workers, each on a loopback address of its own
(127.0.0.2 to .6) and one port, as a Kubernetes headless Service's pods are.

With a stream of tasks running, the name's hosts file is rewritten and dnsmasq told to read it
again (SIGHUP): 2 workers, then 5, then none (an empty answer) and no answer (dnsmasq
stopped), which keep the 5, then 1. Nothing is lost, no healthy worker is ejected or any
task sent twice, the new workers take tasks, the four gone from the answer are drained (no
new tasks, their tasks finished) and then forgotten, their finished results copied to the
router: once those four workers are stopped, every one of their results is still
downloadable through the router.

Waits are bounded; nothing asserts on timings.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
from conftest import ManagedProcess, Processes, Router, free_port, make_pdf, wait_until
from harness.dns import ADDRESSES, Dns
from mineru_health.demo.fleet import HOST, LINE3, Client, Stream

pytestmark = pytest.mark.integration

NAME = "workers.mineru-health.test"
WAIT_S = 120.0


def _worker(
    procs: Processes, site: Path, python: str, scratch: Path, address: str, port: int
) -> ManagedProcess:
    scratch.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "mineru.cli.fast_api", "--host", address, "--port", str(port)]
    proc = procs.start(
        f"mineru-api-{address}",
        argv,
        env=LINE3.env(site, scratch, python, {}),
        log_path=scratch / "mineru-api.log",
        cwd=scratch,
    )
    proc.base_url = f"http://{address}:{port}"
    return proc


def _servers(router: Router) -> dict[str, dict[str, object]]:
    return router.servers()


def _stop(proc: ManagedProcess) -> None:
    """Ends a worker as a scaled-down pod ends (SIGTERM to its process group)."""
    os.killpg(proc.pid, signal.SIGTERM)
    if proc.wait(30.0) is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10.0)


def test_workers_scaled_by_dns_under_load_lose_nothing(
    processes: Processes,
    patched_mineru_site: Path,
    mineru_python: str,
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health dns test page")
    dns = Dns(processes, tmp_path / "dns", NAME, ADDRESSES[:2])
    port = free_port()
    workers = {
        a: _worker(processes, patched_mineru_site, mineru_python, tmp_path / a, a, port)
        for a in ADDRESSES
    }

    def up(proc: ManagedProcess) -> bool:
        if proc.poll() is not None:
            pytest.fail(f"{proc.base_url} exited:\n{proc.log_tail()}")
        try:
            return httpx.get(f"{proc.base_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(lambda: all(up(w) for w in workers.values()), WAIT_S, 0.3), [
        w.log_tail() for w in workers.values()
    ]

    scratch = tmp_path / "router"
    scratch.mkdir()
    router_port = free_port()
    env = {
        "MINERU_ROUTER_HEALTH_PRESET": "fast",
        "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(scratch / "audit.jsonl"),
        "MINERU_ROUTER_HEALTH_UPSTREAM_DNS": f"{NAME}:{port}",
        "MINERU_ROUTER_HEALTH_DNS_SERVERS": dns.servers,
        "MINERU_ROUTER_HEALTH_DNS_INTERVAL_S": "0.5",
        "MINERU_ROUTER_HEALTH_DNS_TIMEOUT_S": "0.5",
    }
    proc = processes.start(
        "mineru-router",
        LINE3.router_argv(mineru_python, router_port, "none"),
        env=LINE3.env(patched_mineru_site, scratch, mineru_python, env),
        log_path=scratch / "router.log",
        cwd=scratch,
    )
    proc.base_url = f"http://{HOST}:{router_port}"
    router = Router(LINE3, proc, scratch, 2)
    servers = router.wait_in_rotation(WAIT_S)
    assert sorted(servers) == ["dns-127.0.0.2", "dns-127.0.0.3"], servers

    def kept_because(outcome: str) -> bool:
        return any(
            r["action"] == "dns_answer_kept" and f": {outcome}: " in r["reason"]
            for r in router.audit_records()
        )

    everyone = sorted(f"dns-{a}" for a in ADDRESSES)
    last = f"dns-{ADDRESSES[-1]}"
    client = Client(router.base, LINE3, engine_url=f"{fake_vlm_url}/delay/800/")
    with Stream(client, lambda n: (f"dns-{n:03d}.pdf", pdf), every_s=0.4, count=36) as stream:
        stream.wait_submitted(6, WAIT_S)
        dns.reload(ADDRESSES)  # 2 -> 5
        assert wait_until(lambda: router.routable() == 5, WAIT_S, 0.3), router.proc.log_tail()
        # An empty answer, then none at all (dnsmasq stopped): the five stay.
        dns.reload(())
        assert wait_until(lambda: kept_because("empty"), WAIT_S, 0.2), router.proc.log_tail()
        os.kill(dns.proc.pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: kept_because("failed"), WAIT_S, 0.2), router.proc.log_tail()
        finally:
            os.kill(dns.proc.pid, signal.SIGCONT)
        assert sorted(_servers(router)) == everyone
        assert router.routable() == 5
        stream.wait_submitted(22, WAIT_S)
        dns.reload(ADDRESSES[-1:])  # 5 -> 1
        assert wait_until(lambda: sorted(_servers(router)) == [last], WAIT_S, 0.3), (
            _servers(router),
            router.proc.log_tail(),
        )
        outcomes = stream.outcomes()

    bad = [(o.name, o.status, o.detail) for o in outcomes if o.status != "completed"]
    assert not bad, (bad, router.proc.log_tail(6000))
    assert len(outcomes) == 36
    by_worker: dict[str, list[str]] = {}
    for outcome in outcomes:
        by_worker.setdefault(outcome.detail["workers_tried"][-1], []).append(outcome.task_id)
    added = [f"dns-{a}" for a in ADDRESSES[2:]]
    assert all(w in by_worker for w in added), by_worker  # every worker added took tasks
    # The last tasks, submitted after the drain, all went to the one worker left.
    assert {o.detail["workers_tried"][-1] for o in outcomes[-4:]} == {last}
    assert all(o.attempts == 1 for o in outcomes), [o.detail for o in outcomes]

    # The drained workers' pods go: their results are the router's copies now.
    drained = [w for w in everyone if w != last]
    for address in ADDRESSES[:-1]:
        _stop(workers[address])
    finished_there = [t for w in drained for t in by_worker.get(w, [])]
    assert len(finished_there) >= 4, by_worker
    for task_id in finished_there:
        answer = client.result(task_id)
        assert answer.status_code == 200, (task_id, answer.text[:300])

    records = router.audit_records()
    actions = [(r["action"], r["worker_id"]) for r in records]
    assert not [r for r in records if r["action"] == "ejected"], records
    for worker in drained:
        assert ("worker_draining", worker) in actions and ("worker_forgotten", worker) in actions
    for worker in added:
        assert ("worker_admitted", worker) in actions
    copied = [r["reason"] for r in records if r["action"] == "worker_forgotten"]
    assert all("not copied" not in reason for reason in copied), copied
    # Every result finished on a drained worker was copied before it was forgotten.
    counts = [re.search(r"(\d+) finished result\(s\) copied", reason) for reason in copied]
    assert sum(int(m.group(1)) for m in counts if m) == len(finished_there), copied
    assert router.metric("mineru_router_dns_workers", state="active") == 1
    assert router.metric("mineru_router_dns_workers", state="draining") == 0
    assert router.metric("mineru_router_dns_worker_changes_total", change="forgotten") == 4
