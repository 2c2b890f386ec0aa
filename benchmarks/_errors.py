"""How the benchmark scripts end on a user error: the CLI's one line, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from spemusic.errors import SpemusicError


def run_script(main: Callable[[], object]) -> None:
    """main(); an unknown model, a missing file or another SpemusicError ends the script with its
    message on one line and exit status 2, as the spemusic commands do."""
    try:
        main()
    except SpemusicError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
