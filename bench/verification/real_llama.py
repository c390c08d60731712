#!/usr/bin/env python3
"""Verification of a real llama.cpp engine, idle and busy decoding for other requests.

Runs in MinerU 4.0's venv (``mineru_llama_cpp``, ``gguf``), with this package on
``PYTHONPATH`` (``run.py --real-llama`` arranges both). One real
``mineru_llama_cpp.Engine`` on the tiny random-weight MinerU 2.5 model of
``mineru_health.demo.engine.tiny_gguf`` (4 slots, as MinerU builds it), and
``judge.confirm`` with that engine as its one handle, as after an
undecided failure:

1. idle: nothing else runs;
2. busy, a slot free: ``busy`` threads each decode a long reply
   (``ignore_eos``) on the other slots, back to back, the whole time;
3. busy, every slot taken: one more such thread, so the probe waits for a slot.
   In a worker, MinerU's engine calls are then in flight, so a check past its
   bound is ``inconclusive`` (never fatal); the engine call is marked in flight
   here too.

Prints one JSON object (medians, p99, the outcomes, ratios to idle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp CPU threads")
    parser.add_argument(
        "--reply-tokens", type=int, default=400, help="tokens each background request decodes"
    )
    args = parser.parse_args()

    from mineru_health.demo.engine import tiny_gguf
    from mineru_health.runtime.worker.health import WorkerHealth
    from mineru_health.runtime.worker.judge import confirm
    from mineru_health.runtime.worker.verification import DEFAULT_TIMEOUT_S, Handle, Verifier
    from mineru_llama_cpp import Engine, SamplingParams

    slots = 4
    with tempfile.TemporaryDirectory(prefix="mineru-health-bench-llama-") as scratch:
        model, mmproj = tiny_gguf.write_pair(Path(scratch))
        engine = Engine(model, mmproj, n_parallel=slots, n_threads=args.threads)
        try:
            verifier = Verifier(find=lambda: [Handle("llama_cpp", "bench", engine)])
            health = WorkerHealth()
            error = RuntimeError("xq7: request 17 came back without its pages")

            def verify_once() -> tuple[float, str]:
                outcome = health.record(error)
                start = time.perf_counter()
                checked = confirm(health, outcome, error, verifier)
                elapsed = time.perf_counter() - start
                assert checked.verification is not None and not checked.fatal, checked
                return elapsed, checked.verification.outcome

            def measure(name: str) -> dict[str, Any]:
                for _ in range(3):
                    verify_once()
                samples = [verify_once() for _ in range(args.rounds)]
                times = sorted(s for s, _ in samples)
                outcomes: dict[str, int] = {}
                for _, outcome in samples:
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                return {
                    "case": name,
                    "median_ms": statistics.median(times) * 1e3,
                    "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
                    "outcomes": outcomes,
                }

            rows = [measure("idle")]
            stop = threading.Event()
            decoded = [0]

            def decode() -> None:
                params = SamplingParams(n_predict=args.reply_tokens, ignore_eos=True)
                while not stop.is_set():
                    result = engine.generate([{"role": "user", "content": "busy"}], params)
                    decoded[0] += result.tokens_predicted

            for busy, name in ((slots - 1, "busy, a slot free"), (slots, "busy, every slot taken")):
                workers = [threading.Thread(target=decode, daemon=True) for _ in range(busy)]
                stop.clear()
                for worker in workers:
                    worker.start()
                time.sleep(0.5)  # every background request decoding
                health.engine_call_started()  # MinerU's own calls are in flight then
                before, started = decoded[0], time.perf_counter()
                try:
                    row = measure(name)
                finally:
                    health.engine_call_finished()
                    stop.set()
                    for worker in workers:
                        worker.join(60)
                row["background_tokens_per_s"] = (decoded[0] - before) / (
                    time.perf_counter() - started
                )
                rows.append(row)
        finally:
            engine.close()
    idle = rows[0]["median_ms"]
    for row in rows:
        row["ratio_to_idle"] = row["median_ms"] / idle
    print(json.dumps({"bound_s": DEFAULT_TIMEOUT_S, "rounds": args.rounds, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
