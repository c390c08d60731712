"""Adapters for MinerU 4.0.x (``mineru-api``: :mod:`.worker`)."""
