"""What watches a running fleet from a thread of its own: its rotation and a health URL;
and one fault run over a document stream (:func:`run_fault`).

    with RotationLog(router, every_s=0.2) as rotation:   # out_at / back_at after a fault
        ...
    with Prober(f"{worker.native_url}/health") as probe:  # latency under load
        ...
    probe.summary()   # {"probes", "p50_ms", "p99_ms", "max_ms", "failures"}

Each runs from ``__enter__`` to ``__exit__``; their readers may run on any thread.
"""

from __future__ import annotations

import contextlib
import ssl
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mineru_health.demo.fleet import Client, Outcome, Router, Stream, text_document
from mineru_health.demo.sandbox import SandboxError, wait_until

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FaultRun", "Prober", "RotationLog", "run_fault"]


class _Sampler:
    """Calls ``_sample`` every ``every_s`` from a thread of its own (a context manager)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._join_s())

    def _join_s(self) -> float:
        return 30.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every_s)

    def _sample(self) -> None:
        raise NotImplementedError


class RotationLog(_Sampler):
    """The router's rotation every ``every_s``: (unix time, workers in rotation, 3.x servers).

    Its readers may run on any thread.
    """

    def __init__(self, router: Router, every_s: float = 0.5) -> None:
        super().__init__(every_s)
        self.router = router
        self.samples: list[tuple[float, int, dict[str, dict[str, Any]]]] = []

    def _sample(self) -> None:
        routable, servers = self.router.line.rotation(self.router.base)
        if routable >= 0:
            self.samples.append((time.time(), routable, servers))

    def out_at(self, since: float) -> float | None:
        """When, at or after ``since``, a worker was first seen out of rotation."""
        return next(
            (t for t, n, _ in list(self.samples) if t >= since and n < self.router.workers), None
        )

    def back_at(self, since: float) -> float | None:
        """When, after :meth:`out_at`, every worker was first seen in rotation again."""
        out = self.out_at(since)
        return (
            None
            if out is None
            else next(
                (t for t, n, _ in list(self.samples) if t > out and n == self.router.workers), None
            )
        )

    def out_of_rotation(self) -> list[tuple[float, str, str]]:
        """3.x: (time, server id, last error) of every server seen out of rotation."""
        return [
            (t, sid, str(entry.get("last_error")))
            for t, _, servers in list(self.samples)
            for sid, entry in servers.items()
            if not entry.get("in_rotation", True)
        ]


class Prober(_Sampler):
    """GET ``url`` every ``every_s``: each answer's latency (s) and status (0: none).

    Its readers may run on any thread.
    """

    def __init__(self, url: str, *, every_s: float = 0.1, timeout_s: float = 60.0) -> None:
        super().__init__(every_s)
        self.url = url
        self.timeout_s = timeout_s
        self.answers: list[tuple[float, int]] = []
        self.max_loop_lag_s = 0.0  # the largest ``loop_lag_s`` a native endpoint reported
        self._client: Any = None

    def _join_s(self) -> float:
        return self.timeout_s + 5.0

    def _run(self) -> None:
        import httpx

        with httpx.Client(
            timeout=self.timeout_s, verify=ssl.create_default_context()
        ) as self._client:
            super()._run()

    def _sample(self) -> None:
        import httpx

        started = time.monotonic()
        try:
            response = self._client.get(self.url)
        except httpx.HTTPError:
            self.answers.append((time.monotonic() - started, 0))
            return
        self.answers.append((time.monotonic() - started, response.status_code))
        with contextlib.suppress(ValueError, AttributeError):
            lag = response.json().get("loop_lag_s")
            if isinstance(lag, int | float):
                self.max_loop_lag_s = max(self.max_loop_lag_s, float(lag))

    @property
    def worst_s(self) -> float:
        return max((latency for latency, _ in list(self.answers)), default=0.0)

    def summary(self) -> dict[str, Any]:
        """Answers and latency percentiles (ms); failures: no answer or not 200."""
        answers = list(self.answers)
        failures = sum(status != 200 for _, status in answers)
        values = sorted(latency for latency, status in answers if status)
        if not values:
            return {"probes": 0, "failures": failures}
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return {
            "probes": len(values),
            "p50_ms": round(statistics.median(values) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2),
            "max_ms": round(values[-1] * 1000, 2),
            "failures": failures,
        }


@dataclass
class FaultRun:
    outcomes: list[Outcome]
    before: list[Outcome]  # completed before the fault
    fault_at: float  # unix time
    out_at: float | None  # first time a worker was out of rotation
    back_at: float | None  # every worker in rotation again after that

    @property
    def lost(self) -> list[Outcome]:
        """Documents refused, failed or not finished."""
        return [o for o in self.outcomes if o.status != "completed"]


def run_fault(
    router: Router,
    inject: Callable[[], object],
    *,
    client: Client | None = None,
    document: Callable[[int], tuple[str, bytes]] = text_document,
    every_s: float = 0.8,
    warm: int = 3,
    recovery_timeout_s: float = 120.0,
    task_timeout_s: float = 240.0,
    after_s: float = 5.0,
    poll_s: float = 1.0,
) -> FaultRun:
    """Streams documents, injects the fault after ``warm`` completed, waits for the end.

    Recovery is read from the router's rotation (:class:`RotationLog`, which
    MinerU's own router shows too): out when a worker left it, back when all
    are in it again; then ``after_s`` more of the stream on the healed (or
    not) fleet, and every document waited for (``task_timeout_s``, bounded).
    """
    client = client or Client(router.base, router.line)
    with (
        Stream(client, document, every_s=every_s, task_timeout_s=None, poll_s=poll_s) as stream,
        RotationLog(router, every_s=0.2) as rotation,
    ):
        if not wait_until(lambda: len(stream.completed()) >= warm, task_timeout_s, poll_s):
            raise SandboxError(f"no job completed: {router.proc.log_tail()}")
        before = stream.completed()
        fault_at = time.time()
        inject()
        wait_until(lambda: rotation.back_at(fault_at), recovery_timeout_s, 0.2)
        time.sleep(after_s)
        outcomes = stream.outcomes(task_timeout_s)
    return FaultRun(
        outcomes, before, fault_at, rotation.out_at(fault_at), rotation.back_at(fault_at)
    )
