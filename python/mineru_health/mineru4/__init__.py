"""Adapters for MinerU 4.0.x: ``mineru-api`` (:mod:`.worker`) and ``mineru-router`` (:mod:`.router`).

Only what touches 4.0's code lives here; the runtime (classifier, worker
state, native endpoint, poller, restart policy, resubmission decisions,
poison guard, metrics) is shared with the 3.x line.
"""

#: The error code of a job's file that the worker's task watchdog failed (its
#: parse made no progress): the router resubmits the job and counts it
#: against the document, and never ejects the worker for it.
TASK_HUNG_CODE = "task_hung"
