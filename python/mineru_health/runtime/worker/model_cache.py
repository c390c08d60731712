"""MinerU's cache of engine clients, looked up without freezing the worker or its other tasks.

Both lines keep their engine clients in ``ModelSingleton``, behind one
re-entrant lock that is held while a client is built. Building an http
client asks its server for the model name, with MinerU's 600-s read timeout,
so a tenant's ``server_url`` that never answers holds that lock for minutes.
``ModelSingleton()`` takes the same lock, and ``_get_model_async`` calls it on
the event loop before handing the lookup to a thread: the worker's whole loop
(status answers, uploads, every other task) froze for as long as the build
waited (60 s in ``test_resubmission``'s tarpit, seen in a stack dump), and
the router's status reads of honest tasks timed out.

:func:`install` wraps both lines' ``ModelSingleton`` and ``_get_model_async``:

- ``ModelSingleton()`` returns the instance, once made, without the lock (it
  is made once and never replaced: reading the class attribute is safe under
  the GIL). Only the first call, before any client exists, takes it.
- an ``http-client`` lookup is a remote wait of its task on that server
  (:mod:`.remote_waits`): bounded like any other, never called hung, and a
  task queued for the lock leaves the queue once its task ended or its wait
  passed a bound (an honest task behind a tarpit's build was failed as hung
  three times over, then given up).
- builds queue on the event loop, one thread at a time, not on threads of
  the loop's small default pool (tasks queued behind a hostile build held
  every one of them: uploads, renders and honest lookups waited for one).
- on 3.x a client already built is returned without the lock and without a
  thread, so a task whose server answers never waits for another's build.
  (4.0's lookup does more than read its cache, for its owners: it keeps it.)

Thread-safety: the wrappers run on any thread (the async one on the loop);
install() runs once, at start-up.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import remote_waits
from .engine_calls import current_task_id
from .health import WorkerHealth

__all__ = ["MODEL_CACHE_SITES", "install", "lock_free_instance", "remote_lookups"]

#: Where each MinerU line keeps its engine clients, and whether its cache key is
#: ``(backend, model_path, server_url)`` (3.x: read without the lock) or not (4.0).
MODEL_CACHE_SITES: tuple[tuple[str, bool], ...] = (
    ("mineru.backend.vlm.vlm_analyze", True),
    ("mineru.model.vlm.runtime", False),
)

_MARK = "__mineru_health_model_cache__"
_REMOTE = "http-client"


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


def _built(cache_owner: Any, backend: Any, model_path: Any, server_url: Any) -> Any:
    models = getattr(cache_owner, "_models", None)
    return models.get((backend, model_path, server_url)) if isinstance(models, dict) else None


def remote_lookups(
    cls: Any,
    health: Callable[[], WorkerHealth],
    *,
    cached_by_key: bool,
    settings: Callable[[], Any] | None = None,
) -> None:
    """``cls.get_model`` for ``http-client``: a remote wait; a built client without the lock
    when ``cached_by_key`` (idempotent). ``settings()``: the worker's, for the wait's bounds."""
    original = cls.__dict__.get("get_model")
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def get_model(
        self: Any, backend: Any, model_path: Any, server_url: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if backend != _REMOTE:
            return original(self, backend, model_path, server_url, *args, **kwargs)
        built = _built(self, backend, model_path, server_url) if cached_by_key else None
        if built is not None:
            return built
        with remote_waits.waiting(
            health(), current_task_id(), remote_waits.configured_server(server_url)
        ):
            remote_waits.wait_for_lock(getattr(self, "_lock", None), health, settings)
            return original(self, backend, model_path, server_url, *args, **kwargs)

    setattr(get_model, _MARK, True)
    cls.get_model = get_model


def _queued_builds(
    original: Callable[..., Any],
    singleton: Any,
    cached_by_key: bool,
    health: Callable[[], WorkerHealth],
) -> Callable[..., Any]:
    """``_get_model_async``: http client builds wait their turn on the loop, one at a time."""
    build_gates: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    @functools.wraps(original)
    async def get_model_async(
        backend: Any, model_path: Any, server_url: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if backend != _REMOTE:
            return await original(backend, model_path, server_url, *args, **kwargs)
        built = _built(singleton(), backend, model_path, server_url) if cached_by_key else None
        if built is not None:
            return built
        gate = build_gates.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        with remote_waits.waiting(
            health(), current_task_id(), remote_waits.configured_server(server_url)
        ):
            async with gate:
                return await original(backend, model_path, server_url, *args, **kwargs)

    setattr(get_model_async, _MARK, True)
    return get_model_async


def _wrap(
    module: ModuleType,
    cached_by_key: bool,
    health: Callable[[], WorkerHealth],
    settings: Callable[[], Any] | None = None,
) -> None:
    cls = getattr(module, "ModelSingleton", None)
    if not isinstance(cls, type) or "_instance" not in cls.__dict__:
        return
    lock_free_instance(cls)
    remote_lookups(cls, health, cached_by_key=cached_by_key, settings=settings)
    current = getattr(module, "_get_model_async", None)
    if current is not None and not getattr(current, _MARK, False):
        module._get_model_async = _queued_builds(  # type: ignore[attr-defined]
            current, cls, cached_by_key, health
        )


def install(
    health: Callable[[], WorkerHealth],
    on_import: Callable[[str, Callable[[ModuleType], None]], None],
    settings: Callable[[], Any] | None = None,
) -> None:
    """Wraps each line's client cache now or when its module is imported; ``settings()``:
    the worker's, for the bounds of a task's wait for the client lock."""
    for module_name, cached_by_key in MODEL_CACHE_SITES:
        on_import(
            module_name,
            functools.partial(_wrap, cached_by_key=cached_by_key, health=health, settings=settings),
        )
