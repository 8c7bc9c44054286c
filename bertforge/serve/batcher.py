"""Dynamic batching: a bounded queue of tokenized requests and the one worker thread that runs them through the
pipelines in token-budget groups, handing each request its rows on its event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import Overloaded
from .metrics import Metrics

log = logging.getLogger("bertforge")


@dataclass
class Job:
    kind: str
    items: list[Any]
    features: list[Any]  # the pipeline's features of `items` (tokenized once, on arrival; `item` indexes `items`)
    tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)
    timing: dict[str, float] | None = None  # gets "queued" and "started" (perf_counter) for the response's headers


def _settle(outcomes: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    """Complete a batch's futures (on the event loop: one wake-up for the whole batch)."""
    for future, result, error in outcomes:
        if future.done():  # the client went away and the handler was cancelled
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _answer(jobs: Sequence[Job], results: Sequence[Any] | None, error: BaseException | None) -> None:
    """Hand each job its part of `results` (or `error`), from the worker thread to each job's event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, BaseException | None]]] = {}
    offset = 0
    for job in jobs:
        part = results[offset: offset + len(job.items)] if results is not None else None
        offset += len(job.items)
        by_loop.setdefault(job.loop, []).append((job.future, part, error))
    for loop, outcomes in by_loop.items():
        loop.call_soon_threadsafe(_settle, outcomes)


class Batcher:
    """A bounded queue of requests and the one thread that runs them through the pipelines in token-budget groups.

    `runners[kind](items, features)` computes a list of inputs from their features (a pipeline's `run_features`)
    and returns one result per input (a sequence or an array).
    """

    def __init__(self, runners: dict[str, Callable[[list[Any], list[Any]], Sequence[Any]]], max_batch_tokens: int,
                 max_queue: int, metrics: Metrics | None = None, max_batch_inputs: int | None = None) -> None:
        self.runners = runners
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_inputs = max_batch_inputs  # TEI's --max-batch-requests: inputs in one batch (None: any)
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.metrics.queue_limit.set(max_queue)
        self.queue: deque[Job] = deque()
        self.cond = threading.Condition()
        self.closing = False
        self.in_flight = 0
        self.thread: threading.Thread | None = None

    # -------------------------------------------------------------- event-loop side
    def start(self, setup: Callable[[], None] | None = None) -> None:
        """Start the worker thread. `setup` runs in it before its first batch, and what it raises is raised here
        (the thread then ends): `Engine` loads and warms its model there."""
        ready, failed = threading.Event(), []

        def work() -> None:
            try:
                if setup is not None:
                    setup()
            except BaseException as err:
                failed.append(err)
                return
            finally:
                ready.set()
            self._run()

        self.thread = threading.Thread(target=work, name="bertforge-serve-batcher", daemon=True)
        self.thread.start()
        ready.wait()
        if failed:
            self.thread.join()
            raise failed[0]

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def depth(self) -> int:
        return len(self.queue)

    def submit(self, kind: str, items: list[Any], features: list[Any], tokens: int,
               timing: dict[str, float] | None = None) -> asyncio.Future:
        """Queue a request (its inputs, their features and their token count); its future gets the list of results.
        `timing` gets when it was queued and when its batch started. Raises Overloaded when the queue is full."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.cond:
            if self.closing or not self.alive:
                raise Overloaded("the server is shutting down")
            if len(self.queue) >= self.max_queue:
                raise Overloaded(f"the queue is full ({self.max_queue} requests waiting); retry later", status=429)
            job = Job(kind, items, features, tokens, loop, future, timing=timing)
            if timing is not None:
                timing["queued"] = job.queued_at
            self.queue.append(job)
            self.metrics.queue(len(self.queue), self.in_flight)
            self.cond.notify()
        return future

    def close(self, timeout: float | None = None) -> None:
        """Finish what is queued, then stop the thread."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout)

    # -------------------------------------------------------------- worker side
    def _take(self) -> list[Job] | None:
        """The oldest job and the later ones of its kind that fit the token budget (in arrival order)."""
        with self.cond:
            while not self.queue and not self.closing:
                self.cond.wait()
            if not self.queue:
                return None
            first = self.queue.popleft()
            jobs, tokens, skipped = [first], first.tokens, []
            inputs, most = len(first.items), self.max_batch_inputs
            while self.queue:
                job = self.queue[0]
                if job.kind != first.kind:
                    skipped.append(self.queue.popleft())
                    continue
                if tokens + job.tokens > self.max_batch_tokens or (most is not None and inputs + len(job.items) > most):
                    break
                jobs.append(self.queue.popleft())
                tokens += job.tokens
                inputs += len(job.items)
            self.queue.extendleft(reversed(skipped))  # other kinds keep their places at the front
            self.in_flight = len(jobs)
            self.metrics.queue(len(self.queue), self.in_flight)
            return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                self._execute(jobs)
            except BaseException as err:  # never leave a client waiting, whatever happened
                log.exception("serve: batch failed")
                _answer(jobs, None, err)
            finally:
                with self.cond:
                    self.in_flight = 0
                    self.metrics.queue(len(self.queue), 0)

    def _execute(self, jobs: list[Job]) -> None:
        items: list[Any] = []
        features: list[Any] = []
        for job in jobs:  # one list of inputs: each job's features point past the inputs of the jobs before it
            offset = len(items)
            items += job.items
            features += job.features if not offset else [replace(f, item=f.item + offset) for f in job.features]
        start = time.perf_counter()
        for job in jobs:
            if job.timing is not None:
                job.timing["started"] = start
        try:
            results = self.runners[jobs[0].kind](items, features)
            if len(results) != len(items):
                raise RuntimeError(f"the pipeline gave {len(results)} results for {len(items)} inputs")
        except Exception as err:
            self.metrics.batch_failed()
            if len(jobs) > 1:  # find the culprit: one request at a time
                for job in jobs:
                    self._execute([job])
                return
            log.error("serve: %s request of %d input(s) failed: %s: %s", jobs[0].kind, len(items),
                      type(err).__name__, err)
            _answer(jobs, None, err)
            return
        self.metrics.batch(len(jobs), len(items), sum(job.tokens for job in jobs), time.perf_counter() - start)
        _answer(jobs, results, None)
