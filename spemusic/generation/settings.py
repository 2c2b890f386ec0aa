"""What a generation is asked for, in one object: GenerationConfig.

The command line builds one from its options and makes one call with it (pieces.generate,
continue_prompt, accompany); a library user builds the same one and gets the same bytes:

    config = GenerationConfig(num=2, bars=16, seed=7, chords=["C:maj", "A:min"])
    pieces = spemusic.generation.pieces.generate(model, tok, config)

Keyword arguments are the short form of the same thing (``generate(model, tok, bars=16, seed=7)``).
Settings left at None are the model's: its sampling defaults, its meter, its tempo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..errors import OptionError
from ..options import CHORD_STRENGTH, model_sampling

if TYPE_CHECKING:  # the command line reads this module before it needs torch
    import torch

    from .cache import CacheOptions

__all__ = ["CHORD_STRENGTH", "GenerationConfig", "MAX_CHORD_STRENGTH", "MAX_PIECES", "SamplingOptions"]

@dataclass
class SamplingOptions:
    temperature: float = 1.0
    top_k: int = 0          # 0: off
    top_p: float = 1.0      # 1.0: off
    bar_top_p: float = 1.0  # the nucleus right after each Bar token (meter change, first onset); 1.0: off
    onset_top_p: float = 1.0  # right after each note, the nucleus among the Positions and the bar line,
                              # their total kept (trim_far_onsets: far onsets leave holes); 1.0: off
    hole_penalty: float = 0.0  # nats off an onset per beat of silence it would leave beyond a quarter
                               # beat (discourage_holes); 0: off
    stacking: float = 1.0   # once an onset holds two notes, the odds of one more there are multiplied by this
                            # (temper_stacking); 1: off
    follow_repeats: float = 0.0  # nats added, in a bar its Repeat mark calls like an earlier one, to the token
                                 # that bar wrote at this place (sampling.follow_like_bars); 0: off
    repeat: float = 0.0     # the continuous cache's largest share (spemusic.generation.cache): the piece copies its
                            # earlier bars where it is somewhere it has been before; 0: off

    def check(self) -> None:
        if not (1e-3 <= self.temperature <= 1e3):  # (NaN fails too) beyond: one-hot or uniform in float32
            raise OptionError("{temperature} must be between 0.001 and 1000 (got {value})", value=self.temperature)
        if self.top_k < 0:
            raise OptionError("{top_k} must be 0 (off) or a positive number (got {value})", value=self.top_k)
        if not (0 < self.top_p <= 1):
            raise OptionError("{top_p} must be in (0, 1] (got {value})", value=self.top_p)
        if not (0 < self.bar_top_p <= 1):
            raise OptionError("{bar_top_p} must be in (0, 1] (got {value})", value=self.bar_top_p)
        if not (0 < self.onset_top_p <= 1):
            raise OptionError("{onset_top_p} must be in (0, 1] (got {value})", value=self.onset_top_p)
        if not (0 <= self.hole_penalty <= 100):
            raise OptionError("{hole_penalty} must be between 0 (off) and 100 (got {value})", value=self.hole_penalty)
        if not (0 < self.stacking <= 10):
            raise OptionError("{stacking} must be in (0, 10] (got {value})", value=self.stacking)
        if not (math.isfinite(self.follow_repeats) and 0 <= self.follow_repeats <= 100):
            raise OptionError("{follow_repeats} must be between 0 (off) and 100 nats (got {value})",
                              value=self.follow_repeats)
        if not (0 <= self.repeat <= 1):
            raise OptionError("{repeat} must be between 0 (off) and 1 (got {value})", value=self.repeat)

    def cache(self) -> CacheOptions | None:
        from .cache import CacheOptions

        return CacheOptions(weight=self.repeat) if self.repeat > 0 else None

    @classmethod
    def for_model(cls, name: str | None, temperature: float = 1.0, top_k: int = 0, own: dict | None = None,
                  **asked) -> SamplingOptions:
        """The options `spemusic generate` samples a model with: those asked (None: not given),
        else the defaults its checkpoint records (`own`: a loaded model's `sampling_defaults`),
        else those of the model released as `name` (its `release_name`; see
        spemusic.options.MODEL_SAMPLING), checked."""
        options = cls(temperature=temperature, top_k=top_k, **model_sampling(name, own, **asked))
        options.check()
        return options


def check_length_bars(length: int | None, bars: int | None) -> None:
    if length is None and bars is None:
        raise OptionError("give {length} N (tokens) or {bars} B")
    if length is not None and bars is not None:
        raise OptionError("give {length} or {bars}, not both")
    if length is not None and length < 1:
        raise OptionError("{length} must be at least 1 (got {value})", value=length)
    if bars is not None and bars < 1:
        raise OptionError("{bars} must be at least 1 (got {value})", value=bars)


MAX_PIECES = 256  # pieces sampled in one batch (each holds its own state, grammar and sequence)
MAX_CHORD_STRENGTH = 100  # nats: e^-100 leaves nothing but the chord tones; more overflows the logits
OVERLAPS = ("trim", "layers")


@dataclass(frozen=True)
class GenerationConfig:
    num: int = 1                          # pieces, sampled together in one batch
    length: int | None = None             # new tokens per piece ...
    bars: int | None = None               # ... or new bars (give one)
    seed: int = 0
    options: SamplingOptions | None = None  # how each token is drawn (None: the model's own defaults)
    chords: tuple[str, ...] | None = None   # one chord per new bar, repeating (spemusic.tokens.chords names)
    chord_strength: float = CHORD_STRENGTH  # with chords: nats added to the bar's chord tones at each pitch
    meter: str | None = None              # "3/4": the time signature of a piece from scratch, held throughout
    tempo: float | None = None            # BPM: the opening tempo of a piece from scratch, written exactly
    key: tuple[int, str] | None = None    # (tonic pitch class, "major"/"minor"): each piece moved to it
    parts: tuple[str, ...] | None = None  # the parts the pieces play (models with parts; None: all)
    overlaps: str = "trim"                # notes over an earlier one of the same pitch: "trim" or "layers"
    weights_dtype: torch.dtype | None = None  # the recurrent step's weights (None: sampling.auto_step_dtype)

    def __post_init__(self) -> None:  # a list given for a tuple: the config stays hashable and fixed
        for name in ("chords", "parts"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @classmethod
    def of(cls, config: GenerationConfig | None, **settings) -> GenerationConfig:
        """`config` with `settings` in place of its values (no config: the defaults)."""
        unknown = set(settings) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown generation setting(s): {', '.join(sorted(unknown))}")
        return replace(config or cls(), **settings)

    def check(self, tokenizer=None) -> None:
        """The settings in range, as one-line errors; with a tokenizer, also that its vocabulary
        can write the chords, meter, tempo and parts asked for."""
        if not 1 <= self.num <= MAX_PIECES:
            raise OptionError("{num} must be between 1 and {most} (got {value}); run several times for more",
                              most=MAX_PIECES, value=self.num)
        if self.length is not None or self.bars is not None:  # accompany takes its length from the melody
            check_length_bars(self.length, self.bars)
        if not 0 <= self.seed < 2**63:
            raise OptionError("{seed} must be between 0 and 2^63 - 1 (got {value})", value=self.seed)
        if not (math.isfinite(self.chord_strength) and 0 <= self.chord_strength <= MAX_CHORD_STRENGTH):
            raise OptionError("{chord_strength} must be between 0 and {most} nats (got {value:g}; at {most}, only "
                              "chord tones are left)", most=MAX_CHORD_STRENGTH, value=self.chord_strength)
        if self.key is not None and self.chords is not None:
            raise OptionError("{key} and {chords}: give one (the chords set the key)")
        if self.overlaps not in OVERLAPS:
            raise OptionError("{overlaps} must be trim or layers (got {value!r})", value=self.overlaps)
        if self.options is not None:
            self.options.check()
        if tokenizer is None:
            return
        from .sampling import chord_ids, opening_tokens  # sampling imports this module

        if self.chords is not None:
            chord_ids(tokenizer, list(self.chords))
        if self.meter is not None or self.tempo is not None:
            opening_tokens(tokenizer, self.meter, self.tempo)
        if self.parts is not None and not tokenizer.config.parts:
            raise OptionError("{parts}: this model has no parts (melody, bridge, piano)")

    def for_model(self, model) -> GenerationConfig:
        """This config with the sampling options `spemusic generate` uses for `model` where none
        were given: those its checkpoint records, else its release name's."""
        if self.options is not None:
            return self
        return replace(self, options=SamplingOptions.for_model(model.release_name, own=model.sampling_defaults))
