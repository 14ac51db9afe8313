"""What a long command shows on standard error while it works: the answers a judge has read (and the tokens, where
a reader counts them) as it reads them, and the step it is in.

A command opens one ``meter``; the readers far below it report each batch they read with ``advance`` without being
handed it (the open meter is a context variable), so reporting costs nothing where none is open (a library call).
On a terminal the meter is a tqdm bar; elsewhere (a log file, a pipe, CI) it writes a plain line every
``LINE_SECONDS`` and one at the end, never carriage returns.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from typing import TextIO

LINE_SECONDS = 30.0

_open: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("clfjudge_meter", default=None)
_stopped: int | None = None  # the signal a command was stopped by (``stop``), until it ends


def stop(signum: int | None) -> None:
    """A command's signal handler says it was stopped (None: the command is over); every report after it raises the
    stop again, in case its first exception was swallowed (Python drops one raised inside a finalizer)."""
    global _stopped
    _stopped = signum


def _raise_if_stopped() -> None:
    import signal

    if _stopped is not None:
        raise KeyboardInterrupt if _stopped == signal.SIGINT else SystemExit(128 + _stopped)


class Meter:
    """Answers and tokens read so far under ``desc``, a note (the caller's own count, e.g. lines scored) and named
    steps, each on a line of its own."""

    def __init__(self, desc: str, stream: TextIO | None = None, every: float | None = None) -> None:
        self.desc, self.stream = desc, stream or sys.stderr
        self.every = LINE_SECONDS if every is None else every
        self.answers = self.tokens = 0
        self.text = ""
        self.started = self._shown = time.monotonic()
        self._since = (self.started, 0, 0)  # the rates count from the last step: (time, answers, tokens)
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(desc=desc, unit="answer", file=self.stream, mininterval=1.0, dynamic_ncols=True)

    def advance(self, answers: int, tokens: int = 0) -> None:
        self.answers += answers
        self.tokens += tokens
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(answers)
        elif time.monotonic() - self._shown >= self.every:
            self._line()

    def note(self, text: str) -> None:
        self.text = text
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix())

    def step(self, text: str) -> None:
        self._since = (time.monotonic(), self.answers, self.tokens)
        line = f"{self.desc}: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.answers or self.text:
            self._line()

    def _postfix(self) -> str:
        parts = [f"{self.tokens:,} tokens"] if self.tokens else []
        return ", ".join(parts + ([self.text] if self.text else []))

    def _line(self) -> None:
        now = time.monotonic()
        since, answers, tokens = self._since
        step = max(now - since, 1e-9)  # an export's steps read at their own speeds (a quantizer reads nothing)
        rate = f", {self.tokens:,} tokens ({(self.tokens - tokens) / step:,.0f}/s)" if self.tokens else ""
        note = f", {self.text}" if self.text else ""
        print(f"{self.desc}: {self.answers:,} answers read ({(self.answers - answers) / step:.2f}/s){rate}{note}, "
              f"{now - self.started:.0f} s", file=self.stream, flush=True)
        self._shown = time.monotonic()


@contextlib.contextmanager
def meter(desc: str, enabled: bool = True, stream: TextIO | None = None) -> Iterator[Meter | None]:
    """The meter readers report to inside the block (None when not ``enabled``: nothing is shown)."""
    if not enabled:
        yield None
        return
    opened = Meter(desc, stream)
    token = _open.set(opened)
    try:
        yield opened
    finally:
        _open.reset(token)
        opened.close()


def advance(answers: int, tokens: int = 0) -> None:
    """``answers`` more read (with ``tokens`` tokens), on the open meter if there is one."""
    _raise_if_stopped()
    if (opened := _open.get()) is not None:
        opened.advance(answers, tokens)


def note(text: str) -> None:
    _raise_if_stopped()
    if (opened := _open.get()) is not None:
        opened.note(text)


def step(text: str) -> None:
    _raise_if_stopped()
    if (opened := _open.get()) is not None:
        opened.step(text)
