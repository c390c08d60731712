"""Several live routers side by side on one shared store (issue 35), either line.

    routers = start_routers(procs, LINE3, python, site, worker_urls, url, tmp_path,
                            lease_s=3.0, env={"MINERU_ROUTER_HEALTH_PRESET": "fast"})

``count`` patched ``mineru-router`` processes, router ``n`` under ``ROUTER_ID``
``router-{n}``, all on the store ``url`` (``STORE_URL``: one PostgreSQL database) and in
front of the same remote workers, in the same order (``--upstream-url``: a shared pool that
no router restarts). Router ``n`` works in ``root/router-{n}`` (its log ``router.log``,
its audit ``audit.jsonl``) and keeps its state in ``root/state-{n}`` (what a test removes
to stand for a lost node). They start side by side; each is returned once it has both
workers in rotation.

    workers, routers = three_routers_on_two_workers3(processes, mineru_api_factory, site,
                                                     python, url, tmp_path, lease_s=3.0)
    survivor = wait_for_one_takeover(routers, (1, 2), "router-0", 30.0)  # its index
    rows = owners(url, keys)       # key -> (owner, version, state), read in PostgreSQL
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import LINE3, Line, Router
from mineru_health.demo.sandbox import HOST, Processes, free_port, wait_until

__all__ = ["owners", "start_routers", "three_routers_on_two_workers3", "wait_for_one_takeover"]


def start_routers(
    procs: Processes,
    line: Line,
    python: str,
    site: Path,
    worker_urls: list[str],
    url: str,
    root: Path,
    *,
    count: int = 3,
    lease_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Router]:
    """``count`` routers on the store ``url``, each in rotation (the module's docstring)."""
    routers = [
        _start(procs, line, python, site, worker_urls, url, root, n, lease_s, env or {})
        for n in range(count)
    ]
    for router in routers:
        router.wait_in_rotation()
    return routers


def three_routers_on_two_workers3(
    procs: Processes,
    mineru_api_factory: Callable[..., Any],
    site: Path,
    python: str,
    url: str,
    root: Path,
    *,
    lease_s: float,
    worker_env: Callable[[int], Mapping[str, str] | None] = lambda n: None,
) -> tuple[list[Any], list[Router]]:
    """The 3.x several-router tests' fleet: two patched ``mineru-api`` workers (``worker_env(n)``
    each) booting while three routers boot in front of them (``start_routers``, preset
    "fast"); returned once every router has both in rotation."""
    workers = [
        mineru_api_factory(site, name=f"mineru-api-{n}", env=worker_env(n), wait_healthy=False)
        for n in (0, 1)
    ]
    routers = start_routers(
        procs,
        LINE3,
        python,
        site,
        [w.base_url for w in workers],
        url,
        root,
        lease_s=lease_s,
        env={"MINERU_ROUTER_HEALTH_PRESET": "fast"},
    )
    return workers, routers


def _start(
    procs: Processes,
    line: Line,
    python: str,
    site: Path,
    worker_urls: list[str],
    url: str,
    root: Path,
    n: int,
    lease_s: float | None,
    env: Mapping[str, str],
) -> Router:
    scratch = root / f"router-{n}"
    scratch.mkdir(parents=True)
    port = free_port()
    argv = line.router_argv(python, port, "none")
    for worker_url in worker_urls:
        argv += ["--upstream-url", worker_url]
    router_env = {
        **env,
        "MINERU_ROUTER_HEALTH_STORE_URL": url,
        "MINERU_ROUTER_HEALTH_ROUTER_ID": f"router-{n}",
        "MINERU_HEALTH_STATE_DIR": str(root / f"state-{n}"),
        "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(scratch / "audit.jsonl"),
    }
    if lease_s is not None:
        router_env["MINERU_ROUTER_HEALTH_LEASE_S"] = str(lease_s)
    proc = procs.start(
        "mineru-router",
        argv,
        env=line.env(site, scratch, python, router_env),
        log_path=scratch / "router.log",
        cwd=scratch,
    )
    proc.base_url = f"http://{HOST}:{port}"
    return Router(line, proc, scratch, len(worker_urls))


def wait_for_one_takeover(
    routers: list[Router], survivors: Sequence[int], gone: str, within_s: float
) -> int:
    """The index of the survivor whose log says it took router ``gone``'s submissions over,
    once one does; asserts that one does within ``within_s`` and that only one did (one
    survivor, in one transaction)."""

    def taken_over_by() -> list[int]:
        return [
            n
            for n in survivors
            if f"taken over from router {gone!r}" in routers[n].proc.log_tail(20000)
        ]

    assert wait_until(lambda: taken_over_by() != [], within_s), [
        routers[n].proc.log_tail(3000) for n in survivors
    ]
    takers = taken_over_by()
    assert len(takers) == 1, takers
    return takers[0]


def owners(url: str, keys: list[str]) -> dict[str, tuple[str, int, str]]:
    """The shared store's rows of ``keys``: key -> (owner, version, state)."""
    import psycopg

    with psycopg.connect(url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT key, owner, version, state FROM submissions WHERE key = ANY(%s)", (keys,)
        ).fetchall()
    return {str(key): (str(owner), int(version), str(state)) for key, owner, version, state in rows}
