#!/usr/bin/env python3
"""What verifying the engine after an undecided failure costs, against a plain classification.

Same process, same run: for one failure no rule knows,

1. baseline: ``WorkerHealth.record(exc)`` (classify the chain natively, record
   the task-local outcome), what every failure already costs;
2. ``record`` then ``judge.confirm`` with one engine handle of each
   verifier, alive (the common case: the check passes), using the fakes of
   ``harness.fake_engines``, which have the real API shapes.

The verifier's own cost is the thread it starts, the wait on it and the
handle reads; the fakes answer at once, so what the real engines add on
top is their health call (vLLM's ``check_health`` reads a flag; lmdeploy's
loop tasks are read as attributes; 4.0's runtime its thread) or, for the two
checks that do work on the device, that work: llama.cpp's one-token probe
generation (its own prompt and one decode step) and torch's one-element op
read back (behind whatever the stream already holds). Those two cannot be
measured here (no model, no accelerator) and are not in these numbers.

Ratios (verify / baseline) are what to compare across machines. Nothing here
is a pass/fail test.

``--real-llama`` adds the llama.cpp check on a real engine (``real_llama.py``, run in
MinerU 4.0's venv: ``MINERU_HEALTH_MINERU4_PYTHON``): the tiny random-weight MinerU 2.5
model of ``tests/engines``, verified idle, then while other requests decode on the other
slots, then with every slot taken; busy medians as ratios to idle, measured in the same run.

    python bench/verification/run.py [--rounds 300] [--json out.json] [--real-llama]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mineru_health.runtime.worker.judge import confirm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import fake_engines as fe
from mineru_health.runtime.worker.health import WorkerHealth
from mineru_health.runtime.worker.verification import Handle, Verifier


def unknown_error() -> Exception:
    return RuntimeError("xq7: request 17 came back without its pages")


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def scenarios() -> list[tuple[str, Callable[[], list[Handle]]]]:
    llama = fe.fake_llama_cpp("alive")
    sys.modules.update(llama)
    llama_engine = llama["mineru_llama_cpp"].Engine()
    torch = fe.fake_torch("alive")
    return [
        (
            "vllm AsyncLLM (errored + check_health)",
            lambda: [Handle("vllm", "h", fe.FakeAsyncLLM("alive"))],
        ),
        ("vllm LLM (core flag)", lambda: [Handle("vllm", "h", fe.FakeLLM("alive"))]),
        ("lmdeploy (loop tasks)", lambda: [Handle("lmdeploy", "h", fe.FakeLmdeployEngine())]),
        (
            "llama.cpp (flags + probe, fake engine)",
            lambda: [Handle("llama_cpp", "h", llama_engine)],
        ),
        (
            "4.0 runtime + vllm",
            lambda: [
                Handle("mineru_runtime", "h", fe.FakeAsyncVlmPredictor("alive")),
                Handle("vllm", "h", fe.FakeAsyncLLM("alive")),
            ],
        ),
        (
            "torch cuda:0 (query + 1-element op, fake torch)",
            lambda: [Handle("device_cuda", "cuda:0", (torch, "cuda", 0))],
        ),
        ("nothing local to check", list),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument(
        "--real-llama",
        action="store_true",
        help="also verify a real llama.cpp engine, idle and busy (MinerU 4.0 venv)",
    )
    args = parser.parse_args()

    health = WorkerHealth()
    error = unknown_error()
    for _ in range(20):  # warm the rule set and the native state
        health.record(error)
    baseline = timed(lambda: health.record(error), args.rounds)
    base_median = statistics.median(baseline)

    rows: list[dict[str, Any]] = [
        {
            "case": "classify + record (baseline)",
            "median_us": base_median * 1e6,
            "p99_us": _p99(baseline) * 1e6,
            "ratio": 1.0,
        }
    ]
    for name, find in scenarios():
        verifier = Verifier(find=find)

        def verified(v: Verifier = verifier) -> None:
            outcome = health.record(error)
            checked = confirm(health, outcome, error, v)
            assert checked.verification is not None and not checked.fatal

        for _ in range(5):
            verified()
        samples = timed(verified, args.rounds)
        median = statistics.median(samples)
        rows.append(
            {
                "case": f"+ verify: {name}",
                "median_us": median * 1e6,
                "p99_us": _p99(samples) * 1e6,
                "ratio": median / base_median,
            }
        )

    width = max(len(row["case"]) for row in rows)
    print(f"{'case':<{width}}  {'median µs':>10}  {'p99 µs':>10}  {'× baseline':>10}")
    for row in rows:
        print(
            f"{row['case']:<{width}}  {row['median_us']:>10.1f}  {row['p99_us']:>10.1f}  "
            f"{row['ratio']:>10.1f}"
        )
    print(f"\n{args.rounds} rounds each; one failure no rule knows; all engines alive")
    results: dict[str, Any] = {"fakes": rows}
    if args.real_llama:
        results["real_llama"] = real_llama()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


def real_llama() -> dict[str, Any]:
    """``real_llama.py`` in MinerU 4.0's venv, this package linked onto its path."""
    python = os.environ.get("MINERU_HEALTH_MINERU4_PYTHON")
    if not python:
        raise SystemExit("--real-llama needs MINERU_HEALTH_MINERU4_PYTHON (MinerU 4.0's python)")
    import mineru_health

    with tempfile.TemporaryDirectory(prefix="mineru-health-path-") as link_dir:
        (Path(link_dir) / "mineru_health").symlink_to(Path(mineru_health.__file__).parent)
        done = subprocess.run(
            [python, str(Path(__file__).with_name("real_llama.py"))],
            env={**os.environ, "PYTHONPATH": link_dir},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"real_llama.py failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"\nreal llama.cpp engine (tiny MinerU 2.5 model, 4 slots), bound "
        f"{report['bound_s']} s, {report['rounds']} rounds each"
    )
    print(f"{'case':<24}  {'median ms':>10}  {'p99 ms':>10}  {'× idle':>7}  outcomes")
    for row in report["rows"]:
        print(
            f"{row['case']:<24}  {row['median_ms']:>10.1f}  {row['p99_ms']:>10.1f}  "
            f"{row['ratio_to_idle']:>7.2f}  {row['outcomes']}"
        )
    return report


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


if __name__ == "__main__":
    raise SystemExit(main())
