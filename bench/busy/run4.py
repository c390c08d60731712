"""Busy is not broken, MinerU 4.0: /v1/health versus the native endpoint under one large job.

One real ``mineru-api`` 4.0.12 (flash tier, offline) parses one large PDF
(``--pages`` pages, an image and 40 text lines each; the flash tier inlines
the images, so the markdown is ~2 MB a page). 4.0 sanitises, hashes and
stores that output on its event loop. Two probers ask every 100 ms: the main
port's ``GET /v1/health`` and, on the patched worker, the native endpoint
(``MINERU_HEALTH_PORT``). Reported per endpoint: p50 / p99 / max latency, and
the ratios measured in the same run: upstream 4.0.12 (an unpatched copy)
against ours, main port against native endpoint.

    MINERU_HEALTH_MINERU4_PYTHON=.venv-mineru4/bin/python \\
        python bench/busy/run4.py [--pages 200] [--no-upstream] [--json out.json]

Timings depend on the machine; read the ratios. 200 pages take a few minutes a side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import run
from mineru_health.testing.sandbox import (
    HOST,
    Processes,
    copy_mineru,
    free_port,
    make_pdf,
    mineru4_api_command,
    mineru4_env,
    mineru4_python,
    patched_site4,
    wait_until,
)
from run import Probes, _probe_while

START_TIMEOUT_S = 180.0
# 4.0 keeps /v1/health waiting for most of a minute here: a probe must outwait it.
run.PROBE_TIMEOUT_S = 600.0


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5.0).status_code
    except httpx.HTTPError:
        return None


def _parse(base: str, pdf: bytes, timeout_s: float) -> str:
    params: list[tuple[str, str | int | float | bool | None]] = [
        ("tier", "flash"), ("output_formats", "markdown"), ("output_formats", "middle_json")]
    submitted = httpx.post(f"{base}/v1/tasks", params=params,
                           files={"files": ("large.pdf", pdf, "application/pdf")}, timeout=300)
    submitted.raise_for_status()
    task_id = submitted.json()["task_id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = str(httpx.get(f"{base}/v1/tasks/{task_id}", timeout=300).json()["status"])
        if status not in ("queued", "running"):
            return status
        time.sleep(1.0)
    return "timed out"


def side(name: str, site: Path, root: Path, python: str, pdf: bytes, *, native: bool,
         timeout_s: float) -> dict[str, Any]:
    port, health_port = free_port(), free_port()
    scratch = root / name
    scratch.mkdir()
    extra = {"MINERU_HEALTH_LOOP_HANG_S": "600"}
    if native:
        extra["MINERU_HEALTH_PORT"] = str(health_port)
    base = f"http://{HOST}:{port}"
    urls = {"main": f"{base}/v1/health"}
    if native:
        urls["native"] = f"http://{HOST}:{health_port}/health"
    with Processes() as procs:
        worker = procs.start(name, mineru4_api_command(python, port, scratch / "uploads"),
                             env=mineru4_env(site, scratch, extra=extra),
                             log_path=scratch / "api.log")
        if not wait_until(lambda: _get(urls["main"]) == 200, START_TIMEOUT_S, 0.5):
            raise RuntimeError(f"{name}: the worker did not start:\n{worker.log_tail()}")
        statuses: list[str] = []
        started = time.monotonic()
        probes: dict[str, Probes] = _probe_while(
            urls, lambda: statuses.append(_parse(base, pdf, timeout_s)))
        wall = time.monotonic() - started
    return {"status": statuses[0] if statuses else "?", "wall_s": round(wall, 1),
            **{endpoint: p.summary() for endpoint, p in probes.items()}}


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    return {key: round(a[key] / max(b[key], 0.01), 1)
            for key in ("p50_ms", "p99_ms", "max_ms") if key in a and key in b}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--no-upstream", action="store_true",
                        help="skip the unpatched 4.0.12 side")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per job, seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    python = mineru4_python()
    if python is None:
        print("set MINERU_HEALTH_MINERU4_PYTHON to a MinerU 4.0 venv's python", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"pages": args.pages}
    with tempfile.TemporaryDirectory(prefix="mineru-health-busy4-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        pdf = make_pdf(args.pages, images_per_page=1, image_px=256, lines_per_page=40, seed=4)
        results["pdf"] = {"bytes": len(pdf), "made_in_s": round(time.monotonic() - started, 1)}
        ours = patched_site4(root / "site-ours", python, faults=False)
        results["ours"] = side("ours", ours, root, python, pdf, native=True,
                               timeout_s=args.timeout)
        print("ours:", json.dumps(results["ours"]))
        if not args.no_upstream:
            upstream = copy_mineru(root / "site-upstream", python)
            results["upstream"] = side("upstream", upstream, root, python, pdf, native=False,
                                       timeout_s=args.timeout)
            print("upstream:", json.dumps(results["upstream"]))
            results["ratio_upstream_main_over_our_native"] = _ratio(
                results["upstream"]["main"], results["ours"]["native"])
        results["ratio_our_main_over_our_native"] = _ratio(
            results["ours"]["main"], results["ours"]["native"])
    print(json.dumps({k: v for k, v in results.items() if k.startswith("ratio")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
