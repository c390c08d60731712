"""The router's and the worker's configuration, as views over the native structs.

Every variable (name, field, type, default, bounds, help, preset values) is
defined once, as one row of ``cpp/include/mineru_health/config_variables.def``;
this module derives its field lists and the README's tables from the native
table built from it and never repeats a name.

    router = HealthSettings.from_env()    # MINERU_ROUTER_HEALTH_*; raises ConfigError
    worker = WorkerSettings.from_env()    # MINERU_HEALTH_*; raises ConfigError
    worker.retry_after_s, worker.port     # 30, None (unset: no native endpoint)
    WorkerSettings.variable_name("exit_on_fatal")   # 'MINERU_HEALTH_EXIT_ON_FATAL'

Both classes are immutable: ``replace`` returns a validated copy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .. import _native
from .._names import enum_name

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "ROUTER_ENV_PREFIX",
    "WORKER_ENV_PREFIX",
    "ConfigComponent",
    "ConfigType",
    "HealthSettings",
    "Variable",
    "WorkerSettings",
    "markdown_tables",
    "variable_json",
    "variables",
]

ConfigComponent = _native.ConfigComponent
ConfigType = _native.ConfigType

ROUTER_ENV_PREFIX: str = _native.env_prefix(ConfigComponent.ROUTER)
WORKER_ENV_PREFIX: str = _native.env_prefix(ConfigComponent.WORKER)


#: One environment variable of the native table (read-only): ``name``, ``field``
#: (attribute of HealthSettings / WorkerSettings; ``""`` when none), ``component`` and
#: ``type`` (native enums), ``default_value`` (as an operator writes it; ``""`` = unset),
#: ``min_value``/``max_value``, ``allowed`` (the accepted values, in words), ``meaning``,
#: ``test_only`` and ``preset_values`` (router: ``(preset, value)`` pairs).
Variable = _native.ConfigVariable

_VARIABLES: tuple[Variable, ...] = tuple(_native.config_variables())


def variable_json(v: Variable) -> dict[str, Any]:
    """One variable as ``mineru-health config --json`` lists it."""
    return {
        "name": v.name,
        "field": v.field,
        "component": enum_name(v.component),
        "type": enum_name(v.type),
        "default": v.default_value,
        "allowed": v.allowed,
        "meaning": v.meaning,
        "test_only": v.test_only,
        "min": v.min_value,
        "max": v.max_value,
        "presets": dict(v.preset_values),
    }


def variables(component: str | None = None) -> tuple[Variable, ...]:
    """Every variable of the native table, or those of one component ("router"...)."""
    return tuple(v for v in _VARIABLES if component is None or enum_name(v.component) == component)


def _fields(component: str) -> tuple[str, ...]:
    return tuple(v.field for v in variables(component) if v.field)


class _Settings:
    """A validated, immutable view over one native configuration struct."""

    __slots__ = ("_config",)

    _COMPONENT: ClassVar[str]
    _PREFIX: ClassVar[str]
    _FIELDS: ClassVar[tuple[str, ...]]
    _NATIVE: ClassVar[Any]

    def __init__(self, config: Any = None) -> None:
        native = self._NATIVE() if config is None else self._NATIVE(config)
        _native.validate(native)
        self._config = native

    @classmethod
    def _env(cls, environ: Mapping[str, str] | None) -> dict[str, str]:
        source = os.environ if environ is None else environ
        return {key: str(value) for key, value in source.items() if key.startswith(cls._PREFIX)}

    @classmethod
    def variables(cls) -> tuple[Variable, ...]:
        """The variables this class reads, in README order."""
        return variables(cls._COMPONENT)

    @classmethod
    def variable_name(cls, field: str) -> str:
        """The environment variable that sets ``field`` (``KeyError`` for an unknown one)."""
        for v in variables(cls._COMPONENT):
            if v.field == field and field:
                return v.name
        raise KeyError(field)

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields changed."""
        native = self._NATIVE(self._config)
        for key, value in changes.items():
            if key not in self._FIELDS:
                raise TypeError(f"unknown {type(self).__name__} field: {key}")
            setattr(native, key, value)
        return type(self)(native)

    @property
    def native(self) -> Any:
        """A copy of the underlying native struct."""
        return self._NATIVE(self._config)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self._config, name) for name in self._FIELDS}

    def __getattr__(self, name: str) -> Any:
        if name in type(self)._FIELDS:
            return getattr(self._config, name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Settings)
            and type(other) is type(self)
            and (self.as_dict() == other.as_dict())
        )

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({fields})"


class HealthSettings(_Settings):
    """Validated router health configuration (``MINERU_ROUTER_HEALTH_*``)."""

    __slots__ = ()

    _COMPONENT = "router"
    _PREFIX = ROUTER_ENV_PREFIX
    _FIELDS = _fields("router")
    _NATIVE = _native.HealthConfig

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HealthSettings:
        """Reads ``MINERU_ROUTER_HEALTH_*`` from ``environ`` (``os.environ`` by default).

        Applies every start-up check of the router, files included. Raises
        ``mineru_health.errors.ConfigError`` whose ``variable`` names the
        variable to fix, for a bad value and for an unknown name alike.
        """
        return cls(_native.health_config_from_env(cls._env(environ)))

    @classmethod
    def preset(cls, name: str) -> HealthSettings:
        return cls(_native.preset(name))

    @staticmethod
    def preset_names() -> list[str]:
        return list(_native.preset_names())


class WorkerSettings(_Settings):
    """Validated worker health configuration (``MINERU_HEALTH_*``; fields: ``variables()``)."""

    __slots__ = ()

    _COMPONENT = "worker"
    _PREFIX = WORKER_ENV_PREFIX
    _FIELDS = _fields("worker")
    _NATIVE = _native.WorkerConfig

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """Reads ``MINERU_HEALTH_*`` from ``environ`` (``os.environ`` by default).

        Applies every start-up check of the worker, files included; names
        that only tools read (``variables("tooling")``) are accepted and
        ignored. Raises ``ConfigError`` naming the variable.
        """
        return cls(_native.worker_config_from_env(cls._env(environ)))


# --- documentation -------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else "unset"


def markdown_tables() -> str:
    """The README's configuration tables, generated from the native table."""
    presets = _native.preset_names()
    others = [p for p in presets if p != "production"]
    lines = [
        "Worker (`mineru-api`, `MINERU_HEALTH_*`; names marked *tooling* are read by the CLI,",
        "the demo or the tests, and accepted and ignored by workers):",
        "",
        "| variable | default | allowed | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for v in (*variables("worker"), *variables("tooling")):
        tooling = v.component is ConfigComponent.TOOLING
        meaning = f"*tooling*: {v.meaning}" if tooling else v.meaning
        lines.append(
            f"| `{v.name}` | {_code(v.default_value)} | {_cell(v.allowed)} | {_cell(meaning)} |"
        )
    lines += [
        "",
        "Router (`mineru-router`, `MINERU_ROUTER_HEALTH_*`; the default is the `production`",
        "preset, and variables set alongside a preset override it):",
        "",
        "| variable | default | " + " | ".join(f"`{p}`" for p in others) + " | allowed | meaning |",
        "| --- | --- | " + " | ".join("---" for _ in others) + " | --- | --- |",
    ]
    for v in variables("router"):
        by_preset = dict(v.preset_values)
        cells = [_code(by_preset[p]) if p in by_preset else "" for p in others]
        lines.append(
            f"| `{v.name}` | {_code(v.default_value)} | "
            + " | ".join(cells)
            + f" | {_cell(v.allowed)} | {_cell(v.meaning)} |"
        )
    return "\n".join(lines) + "\n"
