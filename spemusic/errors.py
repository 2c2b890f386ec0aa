"""User-facing errors: the CLI prints their message on one line and exits non-zero."""

import functools
import string


class SpemusicError(Exception):
    """An error caused by the user's input (file, option, checkpoint), shown without a traceback."""


class MidiError(SpemusicError):
    """A MIDI file that cannot be read, is empty, or holds nothing to tokenize."""


class ConfigError(SpemusicError, ValueError):
    """A configuration value of the wrong type or out of range (an option, a config file, the
    metadata of a checkpoint). Also a ValueError, for library callers."""


class _NamesOptions:
    """A message that names options by parameter: each {field} of `template` that is not among
    `values` is an option ({seq_len}). The message writes them as such (seq_len); `spelled(spell)`
    writes them another way, as the CLI does with its flags (--seq-len)."""

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.spelled(str))

    def spelled(self, spell) -> str:
        fields = {field for _, field, _, _ in string.Formatter().parse(self.template) if field}
        return self.template.format(**self.values, **{name: spell(name) for name in fields - set(self.values)})

    def __reduce__(self):  # pickled as its template and values, not as the message
        return functools.partial(type(self), self.template, **self.values), ()


class OptionError(_NamesOptions, SpemusicError):
    """An error that names the options to change by parameter (see _NamesOptions)."""


class OptionWarning(_NamesOptions, UserWarning):
    """Options that run but are probably not what was meant, named by parameter."""
