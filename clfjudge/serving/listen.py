"""Listening for ``clfjudge serve``: the address bound before the judge loads, and connections that cannot take the
server down.

A connection costs a file descriptor from the moment the kernel hands it over, whether or not it ever sends a
request. So (as nginx's ``client_header_timeout`` and its reuse of idle connections do): a connection must send a
request head within ``Limits.header_timeout_s`` of opening or of its last answer, else it is closed; and only so many
are open at once (``Limits.max_connections``, lowered to fit the process's file limit with room for a burst of
accepts: ``connection_plan``), so a new one closes the oldest connection with no request in progress, or is itself
closed when every one is busy. /healthz then answers however many idle sockets a client holds. What goes wrong at the
socket level (a burst past the file limit, malformed requests) is logged once per cause and interval (``OncePer``),
never a line (or a traceback) per event.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys
import time
from typing import Any

from .server import LOG, Limits

BACKLOG = 128  # the listen queue, and the most connections asyncio accepts in one turn of the loop
SPARE_FILES = 32  # descriptors kept for what the server opens itself (log files, a lazily opened judge part)


class CannotListen(Exception):
    """The address cannot be listened on (in use, not this machine's, a host that does not resolve)."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening: connections are refused until the server is ready), or
    ``CannotListen`` with one line naming the address and the reason."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses its port at once
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def is_loopback(sock: socket.socket) -> bool:
    """Whether the bound socket can be reached from this machine only (its address, as bound, is a loopback one:
    a host name is judged by what it resolved to)."""
    try:
        return ipaddress.ip_address(sock.getsockname()[0]).is_loopback
    except (ValueError, IndexError):  # an address family without an IP address
        return False


def open_files() -> int:
    """Descriptors this process holds now (0 where it cannot tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_plan(limits: Limits) -> tuple[int, int]:
    """(cap, backlog): how many connections may be open at once, and how many the loop accepts in a turn (the
    listen queue). Under a file limit (``ulimit -n``) both shrink to fit it: the cap is ``max_connections`` or what
    the limit leaves once the server's own descriptors, a turn's accepts and a spare are counted, at least 1."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return limits.max_connections, BACKLOG
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections, BACKLOG
    backlog, spare = max(1, min(BACKLOG, soft // 4)), min(SPARE_FILES, soft // 8)
    return max(1, min(limits.max_connections, soft - open_files() - backlog - spare)), backlog


class OncePer:
    """One line per cause per ``seconds``, saying how many more of it came since the last line."""

    def __init__(self, seconds: float = 60.0, stream=None) -> None:
        self.seconds, self.stream = seconds, stream
        self.last: dict[str, float] = {}
        self.quiet: dict[str, int] = {}

    def __call__(self, cause: str, line: str) -> bool:
        now = time.monotonic()
        if cause in self.last and now - self.last[cause] < self.seconds:
            self.quiet[cause] = self.quiet.get(cause, 0) + 1
            return False
        more = self.quiet.pop(cause, 0)
        self.last[cause] = now
        suffix = f" ({more} more since the last such line)" if more else ""
        print(f"clfjudge serve: {line}{suffix}", file=self.stream or sys.stderr, flush=True)
        return True


class _OnceFilter(logging.Filter):
    """A logging filter letting through one record per message per interval (uvicorn logs one per bad request)."""

    def __init__(self, once: OncePer, started) -> None:
        super().__init__()
        self.once, self.started = once, started

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.started():  # a start-up failure is the caller's to report (clfjudge serve: exit 3, its reason)
            return False
        message = (record.getMessage().splitlines() or [record.name])[0]
        exc = record.exc_info[1] if record.exc_info else None
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        cause = record.msg if isinstance(record.msg, str) else message  # one cause, whatever its arguments
        self.once(f"log:{record.name}:{cause}", message + detail)
        return False  # written (or counted) by ``once``


def loop_errors(once: OncePer):
    """An asyncio exception handler: one line per cause, no traceback (asyncio logs a traceback per failed accept,
    and retries every accept of a turn after each)."""

    def handle(_loop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = context.get("message", "error")
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        once(f"loop:{message}:{type(exc).__name__}", f"{message}{detail}")

    return handle


def protocol_class(limits: Limits, cap: int, once: OncePer) -> type:
    """uvicorn's h11 protocol with the head timeout and the connection cap (see the module's docstring)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.idle_since = time.monotonic()
            self.head_timer = self.loop.call_later(limits.header_timeout_s, self._check_head)
            if len(self.connections) > cap:
                self._make_room()

        def busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.idle_since = time.monotonic()

        def connection_lost(self, exc) -> None:
            self.head_timer.cancel()
            super().connection_lost(exc)

        def _check_head(self) -> None:
            if self.transport.is_closing():
                return
            waited = time.monotonic() - self.idle_since
            if self.busy() or waited < limits.header_timeout_s:
                self.head_timer = self.loop.call_later(
                    limits.header_timeout_s - (0 if self.busy() else waited), self._check_head)
                return
            once("head timeout", f"closed connections that sent no request head within {limits.header_timeout_s:g} s")
            self.transport.close()

        def _make_room(self) -> None:
            idle = [c for c in self.connections if isinstance(c, Guarded) and c is not self and not c.busy()
                    and not c.transport.is_closing()]
            victim = min(idle, key=lambda c: c.idle_since) if idle else self
            once("connection cap", f"at {cap} open connections: closed the oldest idle one"
                                   if victim is not self else f"at {cap} open connections, all busy: closed a new one")
            victim.transport.close()

    return Guarded


def server(app, limits: Limits, graceful_s: float = 30.0, log=None):
    """A uvicorn server for ``app`` whose connections are guarded as the module's docstring says, and whose loop
    logs once per cause; once listening, it says where on stderr (or ``log``)."""
    import uvicorn

    once = OncePer(stream=log)
    cap, backlog = connection_plan(limits)
    config = uvicorn.Config(app, http=protocol_class(limits, cap, once), log_level="warning", backlog=backlog,
                            timeout_graceful_shutdown=int(graceful_s) + 1, log_config=None)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            asyncio.get_running_loop().set_exception_handler(loop_errors(once))
            await super().startup(sockets)
            if self.started and self.servers and self.servers[0].sockets:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                where = f"[{host}]" if ":" in host else host
                print(f"clfjudge serve: listening on http://{where}:{port} (at most {cap} connections)",
                      file=log or sys.stderr, flush=True)

    server = Server(config)
    server.once = once
    return server


def serve(app, sock: socket.socket, limits: Limits, graceful_s: float = 30.0, log=None) -> bool:
    """Run ``app`` (``server``) on the bound ``sock`` until stopped (SIGINT / SIGTERM), uvicorn's own log lines
    once per message too. False: the app's start-up failed (it never listened)."""
    run = server(app, limits, graceful_s, log)
    filter_ = _OnceFilter(run.once, lambda: run.started)
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn.access", "asyncio", LOG.name)]
    for logger in loggers:
        logger.addFilter(filter_)
    try:
        run.run(sockets=[sock])
    except SystemExit:  # uvicorn's way out of a failed start-up
        if run.started:
            raise
    finally:
        for logger in loggers:
            logger.removeFilter(filter_)
    return run.started
