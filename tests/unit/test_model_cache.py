"""ModelSingleton() answers without the lock a client build holds (runtime/worker/model_cache)."""

from __future__ import annotations

import threading
import time
from typing import Any

from mineru_health.runtime.worker import model_cache


def _singleton_class() -> type:
    # The shape both MinerU lines share: one instance, one lock held while a client is built.
    class ModelSingleton:
        _instance: Any = None
        _lock = threading.RLock()

        def __new__(cls, *args: object, **kwargs: object) -> Any:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = super().__new__(cls)
            return cls._instance

    return ModelSingleton


def test_the_instance_is_returned_while_a_build_holds_the_lock() -> None:
    cls = _singleton_class()
    model_cache.lock_free_instance(cls)
    first = cls()  # made under the lock
    building = threading.Event()
    release = threading.Event()

    def build() -> None:
        with cls._lock:
            building.set()
            release.wait(10.0)

    builder = threading.Thread(target=build)
    builder.start()
    try:
        assert building.wait(10.0)
        answered: list[object] = []
        asker = threading.Thread(target=lambda: answered.append(cls()))
        asker.start()
        asker.join(5.0)  # unwrapped, it waits for the build (MinerU: up to 600 s)
        assert not asker.is_alive()
        assert answered == [first]
    finally:
        release.set()
        builder.join(10.0)


def test_the_first_instance_is_still_made_once_under_the_lock() -> None:
    cls = _singleton_class()
    model_cache.lock_free_instance(cls)
    made: list[object] = []
    threads = [threading.Thread(target=lambda: made.append(cls())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    assert len(made) == 8 and all(m is made[0] for m in made)


def test_wrapping_twice_wraps_once() -> None:
    cls = _singleton_class()
    model_cache.lock_free_instance(cls)
    wrapped = cls.__dict__["__new__"]
    model_cache.lock_free_instance(cls)
    assert cls.__dict__["__new__"] is wrapped
    start = time.monotonic()
    assert cls() is cls()
    assert time.monotonic() - start < 5.0


def test_both_lines_sites_are_named() -> None:
    modules = {module for module, _ in model_cache.MODEL_CACHE_SITES}
    assert modules == {"mineru.backend.vlm.vlm_analyze", "mineru.model.vlm.runtime"}


class _Health:
    """What remote_lookups needs of WorkerHealth: the remote waits it was told of."""

    def __init__(self) -> None:
        self.waits = 0

    def remote_wait(self, task_id: str, server: str = "") -> Any:
        import contextlib

        @contextlib.contextmanager
        def waiting() -> Any:
            self.waits += 1
            yield

        return waiting()

    def remote_wait_status(self, task_id: str) -> None:
        return None


def _cache_class(built: dict[tuple[object, ...], object]) -> type:
    class ModelSingleton:
        _instance: Any = None
        _models = built
        _lock = threading.RLock()

        def get_model(self, backend: str, model_path: Any, server_url: Any) -> object:
            with self._lock:
                return self._models.setdefault((backend, model_path, server_url), object())

    return ModelSingleton


def test_a_built_client_is_returned_while_another_build_holds_the_lock() -> None:
    honest = object()
    cls = _cache_class({("http-client", None, "http://honest"): honest})
    health = _Health()
    model_cache.remote_lookups(cls, lambda: health, cached_by_key=True)  # type: ignore[arg-type]
    with cls._lock:  # a hostile server's build, on another thread in MinerU
        found: list[object] = []
        asker = threading.Thread(
            target=lambda: found.append(cls().get_model("http-client", None, "http://honest"))
        )
        asker.start()
        asker.join(5.0)
        assert not asker.is_alive() and found == [honest]
    assert health.waits == 0


def test_a_build_for_a_server_is_its_tasks_remote_wait() -> None:
    cls = _cache_class({})
    health = _Health()
    model_cache.remote_lookups(cls, lambda: health, cached_by_key=False)  # type: ignore[arg-type]
    first = cls().get_model("http-client", None, "http://silent")
    assert health.waits == 1
    assert cls().get_model("http-client", None, "http://silent") is first
    assert health.waits == 2  # 4.0's lookups keep MinerU's lock: each one may wait
    cls().get_model("vllm-async-engine", "/models/x", None)
    assert health.waits == 2  # the worker's own engine: not a remote wait
