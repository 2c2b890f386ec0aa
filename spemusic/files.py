"""Input files: checked to be regular files before they are opened. Output files: checked before
any work is done, then written atomically (a temporary file in the same folder, then os.replace),
so a reader (or a kill) never sees a half-written file."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from .errors import OptionError, SpemusicError

_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def check_input_file(path: str | Path, missing: str = "no such file", error: type = SpemusicError) -> Path:
    """Refuse, before opening it, an input that is not a regular file (a link to one is fine): a
    named pipe or a device would block the read forever, and a missing file, a dangling link, a
    link loop or a folder are each named for what they are."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise error(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist") from None
        raise error(f"{path}: {missing}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{path}: a loop of symbolic links (it never reaches a file)") from None
        raise error(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a folder, not a file")
    for test, kind in _SPECIAL_FILES:
        if test(mode):
            raise error(f"{path}: is {kind}, not a regular file")
    return path


def check_output_file(path: str | Path, overwrite: bool = True, option: str = "") -> Path:
    """Refuse, before the work that produces it, an output file that cannot be written: its folder
    missing or read-only, a folder in its place, or (without ``overwrite``) an existing file."""
    path = Path(path)
    label = f"{option} {path}" if option else str(path)
    if path.is_dir():
        raise SpemusicError(f"{label}: is a folder; give a file name")
    if path.exists() and not overwrite:
        raise OptionError("{label}: already exists (use {overwrite} to replace it)", label=label)
    _check_folder(path.parent, label, may_create=False)
    return path


def check_output_folder(path: str | Path, option: str = "-o") -> Path:
    """An output folder may exist (as a folder) or be created under an existing, writable parent."""
    path = Path(path)
    _check_folder(path, f"{option} {path}", may_create=True)
    return path


def _check_folder(folder: Path, label: str, may_create: bool) -> None:
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise SpemusicError(f"{label}: cannot write: {existing} is a file, not a folder")
    if existing != folder and not may_create:
        raise SpemusicError(f"{label}: cannot write: folder {folder} does not exist")
    if not os.access(existing, os.W_OK):
        raise SpemusicError(f"{label}: cannot write: folder {existing} is not writable")


def names_new_folder(out: str | Path) -> bool:
    """An output named with a trailing slash (-o sketches/) that does not exist yet: a folder to
    make, by write_output, once there is something to write."""
    return str(out).endswith(("/", os.sep)) and not Path(out).is_dir()


def write_output(data: bytes, path: str | Path) -> None:
    """Write an output checked before the work: its folder, if new, is made now."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(data, path)


def write_atomically(data: bytes, path: str | Path) -> None:
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file the user asked for, not the temporary one
        raise SpemusicError(f"{path}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; outputs get the usual permissions
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise SpemusicError(f"{path}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
