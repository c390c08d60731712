"""MinerU's cache of engine clients, looked up without freezing the worker's event loop.

Both lines keep their engine clients in ``ModelSingleton``, behind one
re-entrant lock that is held while a client is built. Building an http
client asks its server for the model name, with MinerU's 600-s read timeout,
so a tenant's ``server_url`` that never answers holds that lock for minutes.
``ModelSingleton()`` takes the same lock, and ``_get_model_async`` calls it on
the event loop before handing the lookup to a thread: the worker's whole loop
(status answers, uploads, every other task) froze for as long as the build
waited (60 s in ``test_resubmission``'s tarpit, seen in a stack dump), and
the router's status reads of honest tasks timed out.

:func:`install` wraps both lines' ``ModelSingleton``:

- ``ModelSingleton()`` returns the instance, once made, without the lock (it
  is made once and never replaced: reading the class attribute is safe under
  the GIL). Only the first call, before any client exists, takes it.
- ``get_model`` for the ``http-client`` backend is a remote wait of its task
  (``WorkerHealth.remote_wait``): a task queued behind another server's
  build waits on that server, not on this worker's engine, and the task
  watchdog must not call it hung (it did: an honest task behind a tarpit's
  build was failed as hung three times over, then given up).
- On 3.x, a client already built is returned without the lock, so a task
  whose server answers never waits for another's build. (4.0's lookup does
  more than read its cache, for its owners: it keeps the lock.)

Thread-safety: the wrapper runs on any thread; install() runs once, at start-up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...worker import WorkerHealth
from .engine_calls import current_task_id

__all__ = ["MODEL_CACHE_SITES", "install"]

#: Where each MinerU line keeps its engine clients, and whether its cache key is
#: ``(backend, model_path, server_url)`` (3.x: read without the lock) or not (4.0).
MODEL_CACHE_SITES: tuple[tuple[str, str, bool], ...] = (
    ("mineru.backend.vlm.vlm_analyze", "ModelSingleton", True),
    ("mineru.model.vlm.runtime", "ModelSingleton", False),
)

_MARK = "__mineru_health_lock_free_instance__"


def lock_free_instance(cls: Any) -> None:
    """``cls()`` returns ``cls._instance`` without the class's lock once it exists (idempotent)."""
    original = cls.__dict__.get("__new__")
    made = original.__func__ if isinstance(original, staticmethod) else original
    if made is None or getattr(made, _MARK, False):
        return

    @functools.wraps(made)
    def __new__(klass: Any, *args: Any, **kwargs: Any) -> Any:
        instance = klass.__dict__.get("_instance")
        if instance is not None:
            return instance
        return made(klass, *args, **kwargs)

    setattr(__new__, _MARK, True)
    cls.__new__ = staticmethod(__new__)


def remote_lookups(cls: Any, health: Callable[[], WorkerHealth], *, cached_by_key: bool) -> None:
    """``cls.get_model`` for ``http-client``: a remote wait; a built client without the lock
    when ``cached_by_key`` (idempotent)."""
    original = cls.__dict__.get("get_model")
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def get_model(self: Any, backend: Any, model_path: Any, server_url: Any,
                  *args: Any, **kwargs: Any) -> Any:
        if backend != "http-client":
            return original(self, backend, model_path, server_url, *args, **kwargs)
        if cached_by_key:
            models = getattr(self, "_models", None)
            built = models.get((backend, model_path, server_url)) if isinstance(models, dict) \
                else None
            if built is not None:
                return built
        with health().remote_wait(current_task_id()):
            return original(self, backend, model_path, server_url, *args, **kwargs)

    setattr(get_model, _MARK, True)
    cls.get_model = get_model


def _wrap(module: ModuleType, class_name: str, cached_by_key: bool,
          health: Callable[[], WorkerHealth]) -> None:
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and "_instance" in cls.__dict__:
        lock_free_instance(cls)
        remote_lookups(cls, health, cached_by_key=cached_by_key)


def install(health: Callable[[], WorkerHealth],
            on_import: Callable[[str, Callable[[ModuleType], None]], None]) -> None:
    """Wraps each line's ``ModelSingleton`` now or when its module is imported."""
    for module_name, class_name, cached_by_key in MODEL_CACHE_SITES:
        on_import(module_name, functools.partial(_wrap, class_name=class_name,
                                                 cached_by_key=cached_by_key, health=health))
