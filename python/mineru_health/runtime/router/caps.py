"""The supervisor's caps: what the router keeps, what it admits, what it refused.

``admission.py`` says what admission is (a reservation, a refusal, the room
on a disk); a ``Caps`` is the account of one router's: the submissions and
bytes it keeps (``MAX_KEPT_TASKS``, ``MAX_KEPT_MB``), those admitted and not
yet kept or refused, the room left in the state and scratch directories,
and the refusals so far, by reason (the metrics read them at scrape time).

    caps = Caps(settings, kept_count=..., state_dir=..., retry_after_s=...)
    admission = caps.admit(size)   # Refused: 503 past a cap or with the store out of reach,
                                   # 507 without room
    caps.hold(size)                # a submission kept (the supervisor's keep)
    caps.let_go(size)              # one that ended or was dropped
    raise caps.refuse(STORAGE, detail, directory)   # counted

Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from mineru_health import safe_text
from mineru_health.runtime.settings import HealthSettings

from .admission import (
    CAP,
    ROW_MARGIN_BYTES,
    STORAGE,
    STORE_DOWN,
    Admission,
    Refused,
    lack_of_room,
)

__all__ = ["Caps"]

_log = safe_text.logger("mineru_health.router.supervisor")

_MIB = 1024 * 1024


class Caps:
    """The caps on kept submissions and their bytes, the room on disk, the refusals."""

    def __init__(
        self,
        settings: HealthSettings,
        *,
        kept_count: Callable[[], int],
        state_dir: Callable[[], Path | None],
        retry_after_s: int,
        unreachable: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.max_kept = int(settings.max_kept_tasks)
        self.max_kept_bytes = int(settings.max_kept_mb) * _MIB
        self._kept_count = kept_count  # submissions kept now (the supervisor's)
        self._state_dir = state_dir  # where the store writes, or None
        self._retry_after_s = retry_after_s
        self._unreachable = unreachable  # the store's Store.unreachable
        self.kept_bytes = 0
        self._admitted: set[Admission] = set()  # admitted, not yet kept or refused
        self.admitted_bytes = 0
        #: Submissions refused, by ``admission.CAP`` (503) and ``admission.STORAGE`` (507);
        #: ``admission.STORE_DOWN`` (503) from its first.
        self.refusals = {CAP: 0, STORAGE: 0}
        self._refusing_storage = False  # logged once per streak of 507s (or store 503s)

    def admit(self, size_bytes: int) -> Admission:
        """Reserves a place and ``size_bytes`` for a submission about to be staged; raises
        :class:`Refused`: 503 past the caps or while the store cannot be reached (nothing
        staged or sent that could not be kept), 507 when a directory it is written to has
        no room for it (see ``Supervisor.admit``)."""
        down = self._unreachable()
        if down is not None:
            raise self.refuse(STORE_DOWN, self.unreachable_detail(down))
        size_bytes = max(0, int(size_bytes))
        count = self._kept_count() + len(self._admitted)
        if count >= self.max_kept:
            raise self.refuse(
                CAP,
                f"the router keeps {count} submissions for resubmission "
                f"(MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS={self.max_kept}); "
                "retry shortly",
            )
        self._check_bytes(size_bytes)
        room = self._lack_of_room(size_bytes)
        if room is not None:
            directory, why = room
            raise self.refuse(
                STORAGE, f"insufficient storage: {why}; retry once room returns", directory
            )
        if self._refusing_storage:
            self._refusing_storage = False
            _log.warning("the router's storage takes submissions again: they are accepted")
        admission = Admission(size_bytes, self._resize, self._unreserve)
        self._admitted.add(admission)
        self.admitted_bytes += size_bytes
        return admission

    def hold(self, size_bytes: int) -> None:
        """A submission of ``size_bytes`` is kept."""
        self.kept_bytes += size_bytes

    def let_go(self, size_bytes: int) -> None:
        """A kept submission of ``size_bytes`` is not any more."""
        self.kept_bytes -= size_bytes

    def _check_bytes(self, more: int) -> None:
        held = self.kept_bytes + self.admitted_bytes
        # One upload larger than the whole cap is taken alone, never refused for good.
        if held + more > self.max_kept_bytes and (held > 0 or self._kept_count() > 0):
            raise self.refuse(
                CAP,
                f"the router keeps {held / _MIB:.0f} MiB of uploads for "
                f"resubmission and this one adds {more / _MIB:.1f} MiB "
                f"(MINERU_ROUTER_HEALTH_MAX_KEPT_MB="
                f"{self.max_kept_bytes // _MIB}); retry shortly",
            )

    def _resize(self, admission: Admission, size_bytes: int) -> None:
        more = max(0, int(size_bytes)) - admission.size_bytes
        if more > 0:
            try:
                self._check_bytes(more)
            except Refused:
                admission.close()
                raise
        self.admitted_bytes += more
        admission.size_bytes += more

    def _unreserve(self, admission: Admission) -> None:
        if admission in self._admitted:
            self._admitted.remove(admission)
            self.admitted_bytes -= admission.size_bytes

    def _lack_of_room(self, size_bytes: int) -> tuple[str, str] | None:
        """The directory the submission would be written to that has no room for it."""
        reserved = self.admitted_bytes
        state = self._state_dir()
        if state is not None:
            room = lack_of_room([state], size_bytes + ROW_MARGIN_BYTES, reserved)
            if room is not None:
                return room
        # MinerU stages every upload in the router's scratch (tempfile's directory) first.
        return lack_of_room([tempfile.gettempdir()], size_bytes, reserved)

    def unreachable_detail(self, why: str) -> str:
        """The refusal's text while the store cannot be reached (``why``: where, what)."""
        return (
            f"{why}: the router does not accept a submission it cannot keep; "
            f"retry after {self._retry_after_s} s"
        )

    def refuse(self, reason: str, detail: str, directory: str | None = None) -> Refused:
        """A refusal of a submission (``admission.CAP`` or ``STORAGE``), counted, to raise."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        if reason == STORE_DOWN and not self._refusing_storage:  # once per streak
            self._refusing_storage = True
            _log.error("submissions refused with 503 until the store is back: %s", detail)
        if reason == STORAGE and not self._refusing_storage:  # once per streak
            self._refusing_storage = True
            _log.error("submissions refused with 507 until room returns: %s", detail)
        return Refused(reason, detail, self._retry_after_s, directory)

    def say_if_full(self) -> None:
        """At start-up: one log line when the state directory has no room for a submission
        (what the router holds is served; new submissions get 507 until room returns)."""
        room = self._lack_of_room(0)
        if room is not None:
            self._refusing_storage = True
            _log.error(
                "the router's storage is full: %s; new submissions are refused with "
                "507 until room returns, what it holds is served",
                room[1],
            )
