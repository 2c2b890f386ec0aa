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


def check_output_file(path: str | Path, overwrite: bool = True, option: str = "", may_create: bool = False) -> Path:
    """Refuse, before the work that produces it, an output file that cannot be written: its folder
    missing (unless ``may_create``: write_output makes it) or read-only, a folder in its place, or
    (without ``overwrite``) an existing file."""
    path = Path(path)
    label = f"{option} {path}" if option else str(path)
    if path.is_dir():
        raise SpemusicError(f"{label}: is a folder; give a file name")
    if path.exists() and not overwrite:
        raise OptionError("{label}: already exists (use {overwrite} to replace it)", label=label)
    _check_folder(path.parent, label, may_create=may_create)
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


def write_output(data, path: str | Path, overwrite: bool = True) -> None:
    """Write an output checked before the work: its folder, if new, is made now."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(data, path, overwrite)


def write_atomically(data, path: str | Path, overwrite: bool = True) -> None:
    """Write `data` (bytes, or a function that writes into a binary file) to a temporary file, then
    give it the final name. Without ``overwrite`` the name is
    taken with a hard link, which fails if the file exists: of several processes writing one name,
    one wins and the others are refused, even when they all checked the name before their work."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file the user asked for, not the temporary one
        raise SpemusicError(f"{path}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data) if isinstance(data, (bytes, bytearray, memoryview)) else data(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; outputs get the usual permissions
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except FileExistsError:
        Path(tmp).unlink(missing_ok=True)
        raise OptionError("{path}: already exists: another process wrote it meanwhile (use {overwrite} to "
                          "replace it)", path=str(path)) from None
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise SpemusicError(f"{path}: cannot write ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _link_new(tmp: str, path: Path) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:  # a file system without hard links: exclusive create, then copy
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        with open(path, "xb") as out, open(tmp, "rb") as src:
            out.write(src.read())
    os.unlink(tmp)
