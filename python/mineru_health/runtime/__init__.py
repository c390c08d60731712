"""The runtime both MinerU lines share: engine- and version-agnostic.

``router`` supervises a router's workers (the fleet: native poller and
restart policy) and keeps its submissions until they end (the supervisor:
resubmission, retry budget, poison guard). The adapters for each MinerU line
(:mod:`mineru_health.mineru3`, :mod:`mineru_health.mineru4`) hold only what
touches that line's code.
"""
