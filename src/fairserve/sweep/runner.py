"""Where runs execute: in this process, in local worker processes, or as tasks on a Ray cluster. One interface for
`fairserve sweep` and `fairserve reproduce`: `imap` (results in order; a worker's exception is raised as is) and
`imap_unordered` (each item's outcome as it finishes, failures included, so one bad run loses no other)."""

from __future__ import annotations

import importlib
import logging
import signal
import socket
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from .spec import SweepError
from .store import PACKAGE

IN_FLIGHT_PER_WORKER = 4  # runs handed out ahead of time: workers never wait, an interrupt drops little


@dataclass(frozen=True)
class Outcome:
    index: int  # the item's position in the input
    value: Any = None
    error: str | None = None  # one line: the exception's type and message


class Runner(ABC):
    description: str
    workers: int

    @abstractmethod
    def imap(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
        """fn(item) for every item, in order."""

    @abstractmethod
    def imap_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        """An `Outcome` per item, as each finishes."""

    @abstractmethod
    def close(self) -> None:
        """Release the workers once their work is done."""

    @abstractmethod
    def terminate(self) -> None:
        """Stop now; unfinished work is dropped."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()


def describe_error(e: BaseException) -> str:
    lines = traceback.format_exception_only(type(e), e)
    return lines[-1].strip() if lines else type(e).__name__


def _worker_init() -> None:
    # NOTE: Ctrl-C reaches the whole process group; the driver alone handles it (and stops the workers), so workers
    # do not die mid-run printing tracebacks. SIGTERM (how the driver stops them) keeps its default.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class LocalRunner(Runner):
    """`jobs` worker processes (created on first use), or this process alone for jobs = 1."""

    def __init__(self, jobs: int = 1):
        self.workers = max(1, jobs)
        self.description = f"{self.workers} local process{'es' if self.workers > 1 else ''}"
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_init)
        return self._pool

    def imap(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
        if self.workers == 1:
            return map(fn, items)
        return self._executor().map(fn, items)

    def imap_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        if self.workers == 1:
            return _in_process(fn, items)
        return self._bounded(fn, items)

    def _bounded(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        pool, todo = self._executor(), iter(enumerate(items))
        pending: dict[Future[Any], int] = {}
        limit = IN_FLIGHT_PER_WORKER * self.workers
        while True:
            while len(pending) < limit and (nxt := next(todo, None)) is not None:
                pending[pool.submit(fn, nxt[1])] = nxt[0]
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                index = pending.pop(f)
                e = f.exception()
                yield Outcome(index, error=describe_error(e)) if e is not None else Outcome(index, f.result())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def terminate(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # NOTE: before Python 3.14 (terminate_workers) the executor has no public way to stop work already running
        stop = getattr(pool, "terminate_workers", None)
        if stop is not None:
            stop()
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5)


def _in_process(fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
    for index, item in enumerate(items):
        try:
            yield Outcome(index, fn(item))
        except Exception as e:
            yield Outcome(index, error=describe_error(e))


class RayRunner(Runner):
    """Each item a Ray task on the cluster at `address` ("auto", "HOST:PORT" or "ray://HOST:PORT"). With
    `ship_code`, this process's fairserve package goes to the cluster with the job (Ray's `py_modules`), so every
    node runs the same code; the nodes need fairserve's dependencies (numpy, ...) installed."""

    def __init__(self, address: str, ship_code: bool = True):
        try:
            ray = importlib.import_module("ray")  # NOTE: the optional extra fairserve[ray]; typed Any without stubs
        except ImportError:
            raise SweepError("--ray needs Ray on this machine: pip install 'fairserve[ray]'") from None
        self._ray = ray
        _check_reachable(address)
        try:
            ray.init(
                address=address,
                runtime_env={"py_modules": [str(PACKAGE)]} if ship_code else None,
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            raise SweepError(f"could not connect to the Ray cluster at {address}: {describe_error(e)}") from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.description = f"the Ray cluster at {address} ({self.workers} CPUs)"
        self._pending: list[Any] = []
        self._remote: dict[Callable[[Any], Any], Any] = {}

    def _task(self, fn: Callable[[Any], Any]) -> Any:
        if fn not in self._remote:
            self._remote[fn] = self._ray.remote(num_cpus=1)(fn)
        return self._remote[fn]

    def imap(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
        refs = [self._task(fn).remote(item) for item in items]
        self._pending = refs
        for ref in refs:
            try:
                yield self._ray.get(ref)
            except self._ray.exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None

    def imap_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Outcome]:
        ray, task, todo = self._ray, self._task(fn), iter(enumerate(items))
        pending: dict[Any, int] = {}
        limit = IN_FLIGHT_PER_WORKER * self.workers
        while True:
            while len(pending) < limit and (nxt := next(todo, None)) is not None:
                pending[task.remote(nxt[1])] = nxt[0]
            self._pending = list(pending)
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    yield Outcome(index, ray.get(ref))
                except ray.exceptions.RayTaskError as e:
                    yield Outcome(index, error=describe_error(e.cause if e.cause is not None else e))
                except ray.exceptions.RayError as e:
                    yield Outcome(index, error=describe_error(e))

    def close(self) -> None:
        self._ray.shutdown()

    def terminate(self) -> None:
        for ref in self._pending:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # NOTE: a task that finished meanwhile cannot be cancelled: nothing to stop
                pass
        self._ray.shutdown()


def _check_reachable(address: str) -> None:
    """A HOST:PORT that nothing listens on fails at once (ray.init would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise SweepError(
            f"no Ray cluster answers at {address} ({describe_error(e)}); start one with `ray start --head` "
            "(docs/sweeps.md)"
        ) from None


def make_runner(jobs: int = 1, ray_address: str | None = None) -> Runner:
    return RayRunner(ray_address) if ray_address else LocalRunner(jobs)
