"""What a command writes, kept apart from what it reads: ``check_apart`` refuses an output that is the same file as
an input or as another output (through symlinks and hard links too: files are compared by device and inode, names
not yet on disk by their resolved path), and ``replace_whole`` writes a file beside its destination and renames it
into place, so a run that fails leaves the old file as it was."""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike


class SamePathError(ValueError):
    """An output names a file the command also reads or writes under another role."""


def identity(path: PathLike) -> tuple[Any, ...]:
    """What two names of one file share: device and inode where it exists, else its absolute path with every
    symlink resolved (where a later write would create it)."""
    try:
        st = os.stat(path)
    except OSError:
        return ("path", str(Path(path).resolve()))
    return ("inode", st.st_dev, st.st_ino)


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
    write in (an ``OSError`` naming it; missing directories are made by the writer)."""
    path = Path(path)
    if path.is_dir() and not directory:
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))
    if path.exists() and not path.is_dir() and directory:
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a directory", str(path))
    if path.exists() and not directory and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "is read-only", str(path))
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{parent} is a file, not a directory", str(path))
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"cannot write in {parent}", str(path))


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def replace_whole(path: PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """A file object whose content becomes ``path`` once the block ends without an error (written to a temporary
    file beside it, made durable, renamed into place); a failure leaves ``path`` as it was and no temporary file.
    The new file keeps the old one's permissions (a new one: what the umask allows a plain write)."""
    path = Path(path)
    check_writable(path)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # the directory is missing, read-only or full: name it, not the temporary file
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
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
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_whole(path: PathLike, text: str) -> None:
    """``Path.write_text`` through ``replace_whole``: the file is the old text or the new, never a part."""
    with replace_whole(path) as f:
        f.write(text)
