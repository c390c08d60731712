"""Names of the native enums, as the C++ core's ``to_string`` spells them.

The C++ ``to_string`` functions are the one definition of every enum name
(``"gave_up"``, ``"engine_dead"``...); Python lists of names are derived here,
never written out by hand::

    >>> enum_names(_native.WorkerPhase)
    ('starting', 'healthy', 'unhealthy', 'failed', 'restart_scheduled', 'restarting', 'gave_up')
    >>> enum_name(_native.ProbeStatus.TIMEOUT)
    'timeout'
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from . import _native

__all__ = ["enum_name", "enum_names"]

# RuleKind's name function predates the shared ``to_string`` overloads.
_SPELLERS: dict[type[enum.Enum], Callable[[Any], str]] = {
    _native.RuleKind: _native.rule_kind_name,
}


def enum_name(value: enum.Enum) -> str:
    """The native name of one enum member."""
    speller = _SPELLERS.get(type(value))
    if speller is not None:
        return speller(value)
    name: str = _native.to_string(value)  # type: ignore[call-overload]
    return name


def enum_names(enum_type: type[enum.Enum]) -> tuple[str, ...]:
    """The native names of every member of ``enum_type``, in declaration order."""
    return tuple(enum_name(member) for member in enum_type)
