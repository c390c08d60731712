"""Exceptions raised by mineru-health. One small hierarchy, rooted at MineruHealthError."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "HealthEndpointError",
    "MineruHealthError",
    "PatchError",
    "RulesError",
    "UnsupportedMinerUError",
]


class MineruHealthError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(MineruHealthError, ValueError):
    """Bad configuration, refused at start-up. ``variable`` names what to fix."""

    def __init__(self, message: str, *, variable: str = "") -> None:
        super().__init__(message)
        self.variable = variable


class RulesError(ConfigError):
    """A rules file or pattern could not be used. ``errors`` lists every problem found."""

    def __init__(
        self,
        message: str,
        *,
        variable: str = "MINERU_HEALTH_RULES",
        errors: list[str] | None = None,
    ) -> None:
        super().__init__(message, variable=variable)
        self.errors = list(errors or [])


class HealthEndpointError(MineruHealthError):
    """The native health endpoint could not be served (address in use, bad address)."""


class PatchError(MineruHealthError):
    """The MinerU installation cannot be patched, checked or reverted as asked."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UnsupportedMinerUError(PatchError):
    """The installed MinerU is not a version this package supports (e.g. 4.x)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=3)
