"""User-facing errors: the CLI prints their message on one line and exits non-zero."""


class SpemusicError(Exception):
    """An error caused by the user's input (file, option, checkpoint), shown without a traceback."""


class MidiError(SpemusicError):
    """A MIDI file that cannot be read, is empty, or holds nothing to tokenize."""


class ConfigError(SpemusicError, ValueError):
    """A configuration value of the wrong type or out of range (an option, a config file, the
    metadata of a checkpoint). Also a ValueError, for library callers."""
