"""Adapters for MinerU 3.3-3.4: ``mineru-api`` and ``mineru-router`` (:mod:`.router`).

Only what touches MinerU 3's code lives here; the runtime (classifier, worker
state, native endpoint, fleet, supervisor, policy, stores) is shared with
the 4.0 line.
"""
