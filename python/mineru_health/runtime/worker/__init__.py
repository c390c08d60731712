"""The worker's runtime, for either MinerU line: one module per job.

- ``install.py``      -- the two halves of installing it on a worker's app;
- ``context.py``      -- what the hooks of a process share, and the log;
- ``gate.py``         -- the main port's gate (a dead engine answers 503);
- ``loop_watch.py``   -- the event-loop watcher (loop lag, the line's steps);
- ``threads.py``      -- liveness, exit on fatal, exit with the router;
- ``engine_calls.py`` -- engine calls and requests in flight, the task in context;
- ``store.py``        -- the task store: finished tasks or jobs on disk (SQLite).

Each MinerU line's adapter (``mineru3.worker``, ``mineru4.worker``) gives the
gate its paths, its task store adapter, and installs what touches its own code.
"""
