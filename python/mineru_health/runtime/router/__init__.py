"""The router's runtime, for either MinerU line: one module per job.

- ``fleet.py``      -- the workers: native poller and restart policy, restarts
  as tasks of their own, launches with per-worker variables, process watch,
  passive reports, audit, ``/health`` fields;
- ``supervisor.py`` -- the submissions: kept until they end, asked about when
  their worker is declared failed or restarted, sent again (the line's
  ``Line`` does what differs between MinerU lines);
- ``policy.py``     -- pure decisions: what an answer about a submission
  means, the retry budget;
- ``poison.py``     -- the poison-document guard.
"""
