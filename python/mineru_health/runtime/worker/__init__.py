"""The worker's runtime, for either MinerU line: one module per job.

- ``install.py``        -- the two halves of installing it on a worker's app;
- ``worker_runtime.py`` -- :class:`WorkerRuntime`, what the hooks of one app share,
  built by ``install`` and handed to everything it installs;
- ``log.py``            -- the worker's log lines;
- ``gate.py``           -- the main port's gate (a dead engine answers 503);
- ``loop_watch.py``     -- the event-loop watcher (loop lag, the line's steps);
- ``judge.py``          -- the one judge of a failed task (classify, verify, record, trigger);
- ``line.py``           -- what a MinerU line's worker gives the runtime (:class:`Line`), and
  the one algorithm run on it: hung work failed, a fatal record acted on once;
- ``threads.py``        -- liveness, exit on fatal, exit with the router;
- ``engine_calls.py``   -- engine calls and requests in flight, the task in context;
- ``remote_waits.py``   -- the bounds on a task's wait for a remote engine;
- ``model_cache.py``    -- MinerU's engine client cache, without its lock for remote clients;
- ``store.py``          -- the task store: finished tasks or jobs on disk (SQLite).

Each MinerU line's adapter (``mineru3.worker``, ``mineru4.worker``) gives the
gate its paths and the runtime its :class:`~.line.Line` (with its task store
adapter), and installs what touches its own code.
"""
