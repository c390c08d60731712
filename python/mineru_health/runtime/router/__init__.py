"""The router's runtime, for either MinerU line: one module per job.

- ``fleet.py``      -- the workers: native poller and restart policy,
  membership, passive reports, audit, ``/health`` fields;
- ``member.py``     -- one worker as the line's pool holds it (``Member``);
- ``local_workers.py`` -- the local workers' processes: launches with
  per-worker variables, restarts as tasks of their own, the process watch,
  every process of an instance ended;
- ``supervisor.py`` -- the submissions: kept until they end, asked about when
  their worker is declared failed or restarted, sent again (the line's
  ``Line`` does what differs between MinerU lines);
- ``caps.py``       -- the supervisor's account: what is kept and admitted under the
  caps, the room on disk, the refusals;
- ``policy.py``     -- pure decisions: what an answer about a submission
  means, the retry budget;
- ``poison.py``     -- the poison-document guard;
- ``runtime.py``    -- all of it built by one function both lines' pools call, and
  closed in one order.
"""
