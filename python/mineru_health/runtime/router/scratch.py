"""The router's scratch directory: every temporary directory the router makes, in one
place that outlives no router, however it died.

    root = claim_scratch()   # <tmp>/mineru-health-router-<pid>-XXXX; tempfile uses it from now
    release_scratch()        # at shutdown, after MinerU's own clean-up: removed

MinerU's routers make their temporary directories with ``tempfile`` in the
system's temporary directory: 3.x a worker's output root per launch and a
directory per staged upload, 4.0 a worker's upload directory per launch and
the job sources' store. A router that is killed never removes them. Once the
patched router module is imported, ``tempfile`` makes them (and the fleet's
own) under one directory per router process, claimed with a lock that the
kernel drops when the process ends (``state_dirs.claim``); the next router
to start removes every such directory whose lock no live process holds, and
a router killed before its claim (its pid in the name, gone) or midway
through removing its own (the lock file goes last) included; a router
that shuts down removes its own (``release_scratch``; uvicorn
ends a router on SIGTERM by raising it again, so no ``atexit`` handler
would run).

Workers keep the system's temporary directory: they are not the router's,
and what they make there (engine sockets, compile caches) is theirs.
Not thread-safe: called at import time, on the thread importing the router.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

from mineru_health.runtime.state_dirs import StateLock, claim, remove_claimed, sweep_abandoned

__all__ = ["SCRATCH_PREFIX", "claim_scratch", "release_scratch"]

SCRATCH_PREFIX = "mineru-health-router-"

# (root, its lock, the owner's pid, tempfile.tempdir before the claim)
_claimed: tuple[Path, StateLock, int, str | None] | None = None


def claim_scratch() -> Path:
    """This process's scratch directory (made and claimed on the first call, after sweeping
    those of routers that died), made ``tempfile``'s directory. Idempotent."""
    global _claimed
    if _claimed is None or _claimed[2] != os.getpid():
        before = tempfile.tempdir
        system_tmp = tempfile.gettempdir()
        sweep_abandoned(system_tmp, SCRATCH_PREFIX)
        root = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=system_tmp))
        _claimed = (root, claim(root), os.getpid(), before)
        atexit.register(_remove, root, os.getpid())
    tempfile.tempdir = str(_claimed[0])
    return _claimed[0]


def release_scratch() -> None:
    """Removes this process's scratch directory and lets go of it (``tempfile`` back to
    where it was). Idempotent."""
    global _claimed
    claimed, _claimed = _claimed, None
    if claimed is None or claimed[2] != os.getpid():
        return
    root, lock, _owner, before = claimed
    if tempfile.tempdir == str(root):
        tempfile.tempdir = before
    remove_claimed(root)  # its lock file last: a kill -9 midway leaves it claimed
    lock.release()


def _remove(root: Path, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked child that exits normally
        remove_claimed(root)
