"""The `spemusic` command's entry point: Ctrl-C while the program is still starting (importing
torch takes a while) ends it with one line and exit code 130, as it does later."""

import contextlib
import os
import signal


def _interrupted(signum, frame):
    os.write(2, b"interrupted\n")  # unbuffered: os._exit flushes nothing
    os._exit(130)


@contextlib.contextmanager
def exit_on_ctrl_c():
    """Ctrl-C exits at once (130, one line) instead of raising KeyboardInterrupt. For imports of
    native libraries: raised inside one of their calls back into Python (torch's import makes
    many), KeyboardInterrupt cannot unwind through C++ and aborts the process ("terminate called
    after throwing … KeyboardInterrupt", SIGABRT)."""
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def import_native_libraries(with_torch: bool = True) -> None:
    """What a command needs loaded before its work starts, imported under exit_on_ctrl_c."""
    with exit_on_ctrl_c():
        import symusic  # noqa: F401
        if with_torch:
            import torch  # noqa: F401


def main() -> None:
    with exit_on_ctrl_c():
        from .cli import main as cli_main
    cli_main()
