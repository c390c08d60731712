"""What only the tests and benchmarks use: the classifier corpus, samplers of a running fleet,
fake engines, engine-like child processes. Never installed.

The fleet itself (sandboxes, processes, the fault plugin) is the demo's
(:mod:`mineru_health.demo`). Worker processes that a test starts import
``harness.children`` and ``harness.fake_engines`` when the test's fault plan
asks for them: ``tests/conftest.py`` puts this package on their path.
"""
