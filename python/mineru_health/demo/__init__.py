"""``mineru-health demo``: watch a patched MinerU router heal a worker, on one machine, no GPU.

    mineru-health demo [--scenario engine-death|hung-worker|crash-loop|task-local]
                       [--json] [--keep-temp] [--rate N] [--timeout S]

What it does, all on 127.0.0.1:

1. copies the installed ``mineru`` package into a temporary directory and
   patches the copy (``mineru-health patch apply --mineru-path``); the
   installed MinerU is never touched;
2. starts the fake OpenAI-compatible VLM server
   (:mod:`mineru_health.testing.fake_vlm_server`), so that MinerU's real
   ``vlm-http-client`` parse path completes without a model;
3. starts the real, patched ``mineru-router`` with two router-managed
   ``mineru-api`` workers (``--local-gpus 0,1``), the ``fast`` health preset,
   an audit file and a fault plan path per worker port;
4. sends a steady stream of one-page PDF tasks through the router;
5. injects the scenario's fault into one worker by writing its plan file;
6. prints a live timeline from the router's ``/health``, the audit file, the
   victim worker's own ``/health`` and the task results, then a summary.

Exit status: 0 when the scenario's expected outcome happened (engine-death and
hung-worker: the worker was restarted and is back in rotation; crash-loop:
the router gave up; task-local: one task failed and nothing was restarted),
1 when it did not, 2 when the demo could not be set up, 130 when interrupted.
SIGINT and SIGTERM stop every child process and remove the temporary files.

Layout: ``run.py`` (one run: set-up on :mod:`mineru_health.testing.sandbox`,
signals, teardown, CLI), ``scenarios.py`` (faults, one outcome object each),
``watchers.py`` (router /health, audit file, victim /health), ``load.py``
(the task stream), ``timeline.py`` (events and marks), ``summary.py`` (the
``--json`` dict and the table), ``context.py`` (what they share). Needs the
``demo`` extra (httpx, reportlab, Pillow).
"""

from __future__ import annotations

from .run import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTCOME_MISSED,
    EXIT_SETUP_FAILED,
    Demo,
    build_parser,
    main,
)
from .scenarios import SCENARIOS, Scenario
from .summary import render_summary

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTCOME_MISSED",
    "EXIT_SETUP_FAILED",
    "SCENARIOS",
    "Demo",
    "Scenario",
    "build_parser",
    "main",
    "render_summary",
]
