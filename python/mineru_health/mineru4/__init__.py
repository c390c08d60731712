"""Adapters for MinerU 4.0.x: ``mineru-api`` (:mod:`.worker`), ``mineru-router`` (:mod:`.router`).

Only what touches 4.0's code lives here; the runtime (classifier, worker
state, native endpoint, poller, restart policy, resubmission decisions,
poison guard, metrics) is shared with the 3.x line.
"""

#: The error code of a job's file that the worker's task watchdog failed (its
#: parse made no progress): the router resubmits the job and counts it
#: against the document, and never ejects the worker for it.
TASK_HUNG_CODE = "task_hung"

#: The error code 4.0 itself gives a job's file whose engine died (4.0.12's own
#: engine_dead handling): the worker's verdict on it, the router's resubmission.
ENGINE_DEAD_CODE = "engine_dead"
