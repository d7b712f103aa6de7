"""Files for the service's own user alone. The data dir holds the master key, the private Redis's
password and its AOF (content sealed, but user ids, note ids and times in clear); an export holds
the wrapped data keys. Other local users get nothing: directories 0700, files 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path``, created 0700; one of ours that others may open (made by an older release, or
    by hand) is narrowed to 0700."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_mode & 0o077 and info.st_uid == os.getuid():
        path.chmod(DIRECTORY_MODE)
    return path


class NotPrivate(PermissionError):
    """A file or directory that another local user owns or may write: what it says is not to be trusted."""


def check_private(path: Path) -> Path:
    """``path`` as it is, if this user owns it and nobody else may write it (a directory) or read
    it (a file); else ``NotPrivate``, saying why. Another local user able to plant a file there
    could point our commands at a Redis of theirs."""
    info = path.stat()
    if info.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to another user (uid {info.st_uid}); Engram uses only its own user's files")
    loose = 0o022 if stat.S_ISDIR(info.st_mode) else 0o077
    if info.st_mode & loose:
        raise NotPrivate(
            f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); `chmod go-rwx {path}` to use it"
        )
    return path


def write_private(path: Path, text: str, *, replace: bool = True) -> None:
    """``path`` holds ``text``, 0600. Written aside, then moved into place, so that a reader never
    sees it half written; ``replace=False`` links instead, which never overwrites: of two
    processes writing at once, the first one's text stays."""
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.unlink(missing_ok=True)
    with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "w") as out:
        out.write(text)
    try:
        if replace:
            os.replace(draft, path)
        else:
            os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink(missing_ok=True)


def open_private(path: str | Path) -> IO[str]:
    """``path`` opened for writing, truncated, readable by its owner alone (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    # The mode given to open applies only to a file it creates; a regular file that was already
    # there is narrowed too (not a device or a pipe: `--out /dev/stdout` is left as it is).
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "w")
