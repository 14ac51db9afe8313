"""What a command writes, kept apart from what it reads: ``check_apart`` refuses an output that is the same file as
an input or as another output, by one rule for both sides (``located``: where the OS puts a name once the writer
has made its missing folders; files are then compared by device and inode, through symlinks and hard links, and
names not yet on disk by their nearest existing folder and the rest). ``replace_whole`` writes a file beside its
destination and renames it into place, so a run that fails leaves the old file as it was; it writes through a
symlink to its target and straight into a device or FIFO (``is_stream``), never replacing either."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike


class SamePathError(ValueError):
    """An output names a file the command also reads or writes under another role."""


def located(path: PathLike) -> tuple[str, tuple[str, ...]]:
    """Where the OS puts ``path`` once a writer has made the folders it lacks: its nearest existing ancestor (a real
    path, every symlink on the way resolved as the OS resolves it) and the components below it that do not exist
    yet. A ``..`` below a missing folder undoes that folder (the writer makes ``nd``, so ``nd/..`` is the ancestor
    itself); elsewhere it is the parent of what the OS reached, not of the name as spelled."""
    pending = os.path.join(os.getcwd(), os.fspath(path)).split(os.sep)
    existing, rest, links = os.sep, [], 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if rest and part == "..":
            rest.pop()
        elif rest:
            rest.append(part)
        elif part == "..":
            existing = os.path.dirname(existing)
        elif os.path.islink(candidate := os.path.join(existing, part)):
            links += 1
            if links > 40:  # as the OS gives up (ELOOP): the loop itself is where the name points
                return existing, (part, *pending)
            target = os.readlink(candidate)
            existing = os.sep if os.path.isabs(target) else existing
            pending[:0] = target.split(os.sep)
        elif os.path.lexists(candidate):
            existing = candidate
        else:
            rest.append(part)
    return existing, tuple(rest)


def target(path: PathLike) -> Path:
    """The name the OS writes for ``path`` (``located``): a symlink's target, ``..`` as the writer meets it."""
    existing, rest = located(path)
    return Path(existing, *rest)


def identity(path: PathLike) -> tuple[Any, ...]:
    """What two names of one file share, by one rule whether the file exists or not: device and inode of what the
    OS reaches (``located``), and the components a writer would create below it."""
    try:
        st = os.stat(path)  # what exists: exactly what the OS opens (/dev/stdout and /proc links too)
        return ("inode", st.st_dev, st.st_ino, ())
    except OSError:
        pass
    existing, rest = located(path)
    try:
        st = os.stat(existing)
    except OSError:
        return ("path", existing, rest)
    return ("inode", st.st_dev, st.st_ino, rest)


def is_stream(path: PathLike) -> bool:
    """``path`` is a device, FIFO or socket (``/dev/stdout``, ``/dev/null``, a named pipe): written straight
    through, never replaced by a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_apart(inputs: Mapping[str, PathLike | None] | Iterable[tuple[str, PathLike | None]],
                outputs: Mapping[str, PathLike | None] | Iterable[tuple[str, PathLike | None]]) -> None:
    """Refuse (``SamePathError``) when an output is the same file as an input or as another output. Each is a
    role (the option that names it, e.g. ``--output``) and a path; None: not given."""
    seen: list[tuple[str, PathLike, tuple[Any, ...]]] = []
    for kind, named in (("input", inputs), ("output", outputs)):
        for role, path in named.items() if isinstance(named, Mapping) else named:
            if path is None:
                continue
            ident = identity(path)
            if kind == "output":
                for other_role, other, other_ident in seen:
                    if ident == other_ident:
                        raise SamePathError(f"{role} {path} is the same file as {other_role} ({other}): refused, "
                                            "nothing written (name another file)")
            seen.append((role, path, ident))


def files_of(directory: PathLike, role: str) -> list[tuple[str, Path]]:
    """The files of a directory a command reads (a judge's), each as an input of ``check_apart``."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return [(role, p) for p in sorted(root.rglob("*")) if p.is_file()]


def check_writable(path: PathLike, directory: bool = False) -> None:
    """Refuse, before any work, an output file (``directory``: an output directory, made beside it and renamed)
    that cannot be written: a directory where a file goes or the reverse, a read-only file, a read-only directory to
    write in (an ``OSError`` naming it; missing directories are made by the writer). Judged where the OS writes
    (``target``); a device or FIFO is written as it is."""
    given = Path(path)
    if is_stream(given):
        if directory:
            raise NotADirectoryError(errno.ENOTDIR, "is a device or FIFO, not a directory", str(given))
        if not os.access(given, os.W_OK):
            raise PermissionError(errno.EACCES, "is read-only", str(given))
        return
    path = target(given)
    if path.is_dir() and not directory:
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(given))
    if path.exists() and not path.is_dir() and directory:
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a directory", str(given))
    if path.exists() and not directory and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "is read-only", str(given))
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{parent} is a file, not a directory", str(given))
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"cannot write in {parent}", str(given))


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def replace_whole(path: PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """A file object whose content becomes ``path`` once the block ends without an error (written to a temporary
    file beside it, made durable, renamed into place); a failure leaves ``path`` as it was and no temporary file.
    The new file keeps the old one's permissions (a new one: what the umask allows a plain write). A symlink's
    target is replaced, not the link; a device or FIFO is written straight through."""
    path = Path(path)
    check_writable(path)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    if is_stream(path):  # nothing to rename over: written as it goes
        with open(path, mode, **open_kwargs) as f:
            yield f
        return
    given, path = path, target(path)  # a symlink stays: its target is replaced
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # the directory is missing, read-only or full: name it, not the temporary file
        raise type(exc)(exc.errno, exc.strerror, str(given)) from None
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            permissions = os.stat(path).st_mode & 0o7777
        except OSError:
            permissions = 0o666 & ~_umask()
        os.chmod(tmp, permissions)
        os.replace(tmp, path)
    except BaseException:
        with signals_held(), contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (then arrive as usual), so a cleanup they interrupt is not left
    half done: a user who stops twice, or a supervisor's TERM after an INT, still leaves nothing behind. The Python
    handlers are swapped for one that only notes the signal (a thread's signal mask would not do: the OS hands a
    process's signal to any thread, torch's included, and Python runs the handler in the main thread at once).
    Outside the main thread, where no handler can be set, the block runs as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:
            handler = previous[arrived[0]]
            if callable(handler):
                handler(arrived[0], None)
            elif handler == signal.SIG_DFL:  # the default action (SIGTERM: the end), now that the block is done
                os.kill(os.getpid(), arrived[0])


def discard(path: PathLike) -> None:
    """Remove a folder an interrupted write leaves (a hidden temporary output), whole even if stopped again."""
    with signals_held():
        shutil.rmtree(path, ignore_errors=True)


def write_whole(path: PathLike, text: str) -> None:
    """``Path.write_text`` through ``replace_whole``: the file is the old text or the new, never a part."""
    with replace_whole(path) as f:
        f.write(text)
