"""What a connection may cost the server: deadlines for a request's head and body, and a cap on open connections.

uvicorn closes a connection idle after a response (`timeout_keep_alive`), but a connection that has sent nothing
yet, or part of a head, or part of a body, waits forever: enough of them (slowloris) use up the process's file
descriptors and every other client is refused. `GuardedProtocol` is uvicorn's HTTP protocol (httptools, or h11)
with a `ConnectionGuard`: one timer per connection, armed for whatever the server is waiting on: the head (from the connection's start
or the previous response's end: trickling bytes do not extend it), then the body (from the head's end); never
while the app computes. When it fires the connection is closed, after a 408 when part of a head or a body had
arrived (an idle connection is closed silently, as uvicorn's keep-alive timeout closes one). A connection past
`max_connections` is answered 503 at once and closed. uvicorn's `limit_concurrency` answers 503 only once a head
has arrived, which a half-open connection never sends. (This module imports uvicorn: only a serving process
imports it.)"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .config import ServeConfig
from .errors import TIMED_OUT
#: How long a refused connection waits for the client's head (read and dropped) before it is closed: closing with
#: unread bytes would reset the connection and the client could lose the 503.
REFUSAL_LINGER = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout: float
    body_timeout: float
    max_connections: int


def _raw_response(status: str, message: str, kind: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message, "error_type": kind}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode("ascii") + body


#: `ConnectionGuard`'s base: `object`, typed Any, since the guard mixes into a uvicorn protocol whose attributes
#: and methods (`cycle`, `transport`, `super().data_received` ...) it uses.
_UvicornProtocol: Any = object


class ConnectionGuard(_UvicornProtocol):
    """A deadline for what the server waits on, and the connection cap (see the module's docstring), for either of
    uvicorn's HTTP protocols: it relies on what both keep, `cycle` (`more_body`, `response_complete`,
    `response_started`, `scope`), `connections`, `transport`, `loop` and `on_response_complete`."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.deadline: asyncio.TimerHandle | None = None
        self.waiting_for: Any = None  # "head", the cycle whose body is awaited, or None (the app's turn)
        self.received = False  # whether a byte of the awaited head or body has arrived
        self.refused = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.refused = True
            message = f"the server has {self.limits.max_connections} open connections, its limit; retry later"
            transport.write(_raw_response("503 Service Unavailable", message, "Overloaded", "retry-after: 1\r\n"))
            self.deadline = self.loop.call_later(REFUSAL_LINGER, transport.close)
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self.refused:  # the head of a refused connection: read, dropped, and the connection closed
            self.transport.close()
            return
        self.received = True
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline for what the server now waits on, unless that wait was already timed."""
        cycle = self.cycle
        if self.refused or self.transport is None or self.transport.is_closing():
            return
        if cycle is None or cycle.response_complete:
            waiting_for: Any = "head"
        else:
            waiting_for = cycle if cycle.more_body else None
        if waiting_for is self.waiting_for:
            return  # the same wait goes on: trickling bytes do not move its deadline
        self.waiting_for, self.received = waiting_for, False
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if waiting_for is not None:
            seconds = self.limits.head_timeout if waiting_for == "head" else self.limits.body_timeout
            self.deadline = self.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        what, seconds = (("head", self.limits.head_timeout) if self.waiting_for == "head"
                         else ("body", self.limits.body_timeout))
        cycle = self.cycle
        if what == "body":
            cycle.scope[TIMED_OUT] = True
        if (what == "head" and self.received) or (what == "body" and not cycle.response_started):
            message = f"the request's {what} did not arrive within {seconds:g} s; send it at once"
            self.transport.write(_raw_response("408 Request Timeout", message, "Timeout"))
        self.transport.close()


class GuardedProtocol(ConnectionGuard, AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol (httptools', or h11's where httptools is missing), guarded."""


def protocol_options(config: ServeConfig, protocol: type = GuardedProtocol) -> dict[str, Any]:
    """uvicorn's options for `config`'s connection limits: `uvicorn.Config(app, **protocol_options(config), ...)`.
    (A partial of a module-level class: the worker processes of `--workers N` unpickle it.)"""
    limits = ConnectionLimits(config.head_timeout, config.body_timeout, config.max_connections)
    return {"http": functools.partial(protocol, limits=limits)}


#: File descriptors a serving process keeps beside its connections (the model's files, the listening socket,
#: threads' pipes, logs).
RESERVED_DESCRIPTORS = 128


def ensure_descriptors(max_connections: int) -> None:
    """Raise the process's soft limit of open files to hold `max_connections` connections and the reserve, as far
    as the hard limit allows; a BertforgeError naming the option when it cannot."""
    import resource

    from ..core.errors import BertforgeError

    need = max_connections + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise BertforgeError(f"serve: --max-connections {max_connections} needs {need} open files, and this "
                                 f"process may open {hard} (ulimit -Hn): lower --max-connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
