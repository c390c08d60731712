"""Hooks called by the patched MinerU entry points (``mineru-api`` and ``mineru-router``).

The shipped patches add only calls into these modules; all logic lives here.
"""
