"""``mineru-health probe``: one concurrent sweep over worker URLs, as a table or JSON.

    exit_code = probe_urls(["http://127.0.0.1:8001"], timeout_s=2.0)

Text that comes from workers (the ``detail`` of a probe, which can quote a
worker's ``/health`` error) is escaped before it reaches the terminal:
control characters and ANSI escapes are shown, never interpreted. JSON output
carries the text as it is (``json.dumps`` escapes what JSON needs).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from . import _native
from ._names import enum_name
from .errors import ConfigError
from .runtime.router.fleet import base_url_of, expectations
from .safe_text import printable
from .settings import HealthSettings

__all__ = ["probe_urls"]


def probe_urls(
    urls: Iterable[str],
    *,
    timeout_s: float | None = None,
    expected_status: str | None = None,
    as_json: bool = False,
    settings: HealthSettings | None = None,
    out: TextIO | None = None,
) -> int:
    """Probes every URL once, all concurrently; prints a table (or JSON).

    Returns 0 when every URL answered healthy, 1 otherwise. Settings come from
    ``MINERU_ROUTER_HEALTH_*`` unless given; ``timeout_s`` and
    ``expected_status`` override them. Load fields are required only when the
    expected status is MinerU's ``"healthy"``.
    """
    out = out or sys.stdout
    base = settings or HealthSettings.from_env()
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        if timeout_s <= 0:
            raise ConfigError("timeout must be positive", variable="--timeout")
        changes["probe_timeout_s"] = timeout_s
        changes["connect_timeout_s"] = min(base.connect_timeout_s, timeout_s)
        changes["interval_s"] = max(base.interval_s, timeout_s * 2)
    if expected_status is not None:
        changes["expected_status"] = expected_status
    current = base.replace(**changes) if changes else base
    url_list = list(urls)
    # Ids are positions, so a URL given twice is probed twice and reported in order.
    targets = [_native.Target(str(i), base_url_of(url), False) for i, url in enumerate(url_list)]
    expect = expectations(current, require_load_fields=current.expected_status == "healthy")
    results, _stats = _native.Poller.sweep(targets, current.native, expect)
    by_id = {result.worker_id: result for result in results}
    rows = []
    for target, url in zip(targets, url_list):
        result = by_id.get(target.id)
        if result is None:  # the sweep answers every target; stay safe if one is missing
            rows.append(_row(url, False, "transport_error", 0, 0.0, "no result"))
            continue
        rows.append(
            _row(
                url,
                bool(result.healthy),
                enum_name(result.status),
                int(result.http_status),
                result.latency_s,
                result.detail,
            )
        )
    if as_json:
        out.write(json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
    else:
        _print_table(rows, out)
    return 0 if rows and all(row["healthy"] for row in rows) else 1


def _row(
    url: str, healthy: bool, status: str, http_status: int, latency_s: float, detail: str
) -> dict[str, Any]:
    return {
        "url": url,
        "healthy": healthy,
        "status": status,
        "http_status": http_status,
        "latency_ms": round(latency_s * 1000.0, 1),
        "detail": detail,
    }


def _print_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    headers = ["URL", "STATUS", "HTTP", "LATENCY_MS", "DETAIL"]
    cells = [
        [
            printable(r["url"]),
            r["status"],
            str(r["http_status"] or "-"),
            f"{r['latency_ms']:.1f}",
            printable(r["detail"]),
        ]
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers[:-1])]
    for line in [headers, *cells]:
        padded = [cell.ljust(width) for cell, width in zip(line[:-1], widths)]
        out.write("  ".join([*padded, line[-1]]).rstrip() + "\n")
