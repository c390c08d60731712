"""Adapters for the MinerU 4.0 line (``mineru-api`` and ``mineru-router`` 4.0.x).

Only what touches 4.0's code lives here; the runtime (native poller,
restart policy, resubmission decisions, poison guard, metrics) is shared
with the 3.x line.
"""
