"""The `spemusic` command's entry point: Ctrl-C while the program is still starting (importing
torch takes a while) ends it with one line and exit code 130, as it does later."""

import os
import signal


def _interrupted(signum, frame):
    os.write(2, b"interrupted\n")  # unbuffered: os._exit flushes nothing
    os._exit(130)


def main() -> None:
    previous = signal.signal(signal.SIGINT, _interrupted)
    from .cli import main as cli_main

    signal.signal(signal.SIGINT, previous)
    cli_main()
