"""The worker's ``MINERU_HEALTH_*`` settings, validated at start-up."""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["PORT_ENV", "WorkerSettings"]

PORT_ENV = "MINERU_HEALTH_PORT"


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number", variable=name) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ConfigError(f"{name}={raw!r} must be between {low:g} and {high:g}", variable=name)
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    port: int | None = None
    bind: str = "127.0.0.1"
    loop_hang_s: float = 60.0
    stall_s: float = 300.0
    exit_on_fatal: bool = False
    exit_grace_s: float = 5.0
    retry_after_s: int = 30
    expose_errors: bool = False
    error_budget: int = 3
    error_budget_window_s: float = 60.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        env = os.environ if environ is None else environ
        raw_port = env.get(PORT_ENV, "").strip()
        port = None if not raw_port else int(_number(env, PORT_ENV, 0, 0, 65535))
        bind = env.get("MINERU_HEALTH_BIND", "").strip() or "127.0.0.1"
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            raise ConfigError(f"MINERU_HEALTH_BIND={bind!r} is not an IP address",
                              variable="MINERU_HEALTH_BIND") from None
        return cls(
            port=port,
            bind=bind,
            loop_hang_s=_number(env, "MINERU_HEALTH_LOOP_HANG_S", 60.0, 1.0, 86400.0),
            stall_s=_number(env, "MINERU_HEALTH_STALL_S", 300.0, 0.0, 86400.0),
            exit_on_fatal=_flag(env, "MINERU_HEALTH_EXIT_ON_FATAL"),
            exit_grace_s=_number(env, "MINERU_HEALTH_EXIT_GRACE_S", 5.0, 0.0, 3600.0),
            retry_after_s=int(_number(env, "MINERU_HEALTH_RETRY_AFTER_S", 30, 1, 3600)),
            expose_errors=_flag(env, "MINERU_HEALTH_EXPOSE_ERRORS"),
            error_budget=int(_number(env, "MINERU_HEALTH_ERROR_BUDGET", 3, 0, 1000)),
            error_budget_window_s=_number(env, "MINERU_HEALTH_ERROR_BUDGET_WINDOW_S", 60.0,
                                          1.0, 86400.0),
        )
