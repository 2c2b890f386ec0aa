"""The vocabulary of the REMI tokenizer: TokenizerConfig, the token kinds and parts, the bins and
the token table with its ids (:class:`Vocabulary`, which REMITokenizer is). The format itself is
described in :mod:`spemusic.tokens.tokenizer`."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from fractions import Fraction

import numpy as np

from spemusic.errors import ConfigError, MidiError
from spemusic.tokens.chords import CHORD_NAMES

# Bump when the meaning of a token sequence changes: it is part of the fingerprint.
SCHEME = "remi-1"
TICKS_PER_STEP_OUT = 40
# chord markers: vocabulary names, and "N.C." (no chord) for N, a word too common to read back
NO_CHORD_MARK = "N.C."
CHORD_MARKS = {**{n: n for n in CHORD_NAMES[:-1]}, NO_CHORD_MARK: CHORD_NAMES[-1]}
CHORD_SET = frozenset(CHORD_MARKS)

# Token kinds: REMITokenizer.kinds[id] is the kind of each id; the decoder and the grammar
# (spemusic.tokens.grammar) read them from there, so the vocabulary is defined once, in __init__
PAD, BOS, EOS, BAR, TIMESIG, POSITION, TEMPO, PROGRAM, PITCH, VELOCITY, DURATION, CHORD, REPEAT = range(13)
# the kinds that span a range of ids (REMITokenizer.range), in vocabulary order
KINDS = {"TimeSig": TIMESIG, "Position": POSITION, "Tempo": TEMPO, "Program": PROGRAM, "Pitch": PITCH,
         "Velocity": VELOCITY, "Duration": DURATION, "Chord": CHORD, "Repeat": REPEAT}
# the bar lags a Repeat mark names (0: no repeat); see spemusic.tokens.repeats
REPEAT_LAGS = (0, 1, 2, 4, 8)
DRUMS = 128  # program code of drum notes
# parts (TokenizerConfig.parts): the roles of POP909's tracks, told apart by track name, with
# program codes after the drums (so a part's notes sort after every GM program at an onset)
PARTS = ("melody", "bridge", "piano")
PART_CODES = {name: DRUMS + 1 + i for i, name in enumerate(PARTS)}
PART_OF_CODE = {code: name for name, code in PART_CODES.items()}


def part_of_track(name: str) -> str | None:
    """The part a track plays, by its name (MELODY, BRIDGE, PIANO in any case; "PIANO (layer 2)",
    as decode names a part's overlapping notes, too), or None."""
    key = (name or "").split(" (layer ")[0].strip().lower()
    return key if key in PART_CODES else None


def parse_part_programs(text: str) -> dict[int, int]:
    """'melody=73,bridge=48' -> {part code: GM program}; a ConfigError names a bad item."""
    out = {}
    for item in (x.strip() for x in str(text).split(",") if x.strip()):
        part, _, program = item.partition("=")
        if not program.strip().isdigit() or not 0 <= int(program) <= 127:
            raise ConfigError(f"part program {item!r}: write PART=PROGRAM with a GM program 0-127 (melody=73)")
        out[PART_CODES[parse_parts(part)[0]]] = int(program)
    return out


def parse_parts(text: str) -> tuple[str, ...]:
    """'melody,piano' -> ('melody', 'piano'); a part that is not one of PARTS is a ConfigError."""
    names = tuple(dict.fromkeys(x.strip().lower() for x in str(text).split(",") if x.strip()))
    bad = [n for n in names if n not in PART_CODES]
    if bad or not names:
        what = f"unknown part {bad[0]!r}" if bad else "no part named"
        raise ConfigError(f"{what}: the parts are {', '.join(PARTS)} (comma-separated)")
    return names


class TokenError(MidiError, ValueError):
    """A token string or id that is not in the vocabulary."""


# (lowest, highest) of the integer fields: 960 steps a beat is the finest MIDI grid in common use;
# the rest are far above what music needs and bound the vocabulary a config can ask for
_TOKENIZER_INT_RANGES = dict(beat_resolution=(1, 960), num_velocity_bins=(1, 127), num_tempo_bins=(1, 1024),
                             max_duration_beats=(1, 64), max_bar_beats=(1, 64))
# the true/false fields, off by default (a config without one keeps the fingerprint it had before it existed)
_FLAGS = ("chords", "parts", "melody_first", "chord_every_bar", "drum_grid", "repeats", "copies")


def default_time_signatures(max_bar_beats: int = 8, beat_resolution: int = 12) -> tuple[tuple[int, int], ...]:
    """n/2 (n >= 2), n/4, n/8 and n/16 (odd n >= 5 only) with bar length <= max_bar_beats quarters."""
    out: list[tuple[int, int]] = []
    cands = [(n, 2) for n in range(2, 9)] + [(n, 4) for n in range(1, 17)] + [(n, 8) for n in range(1, 33)]
    cands += [(n, 16) for n in (5, 7, 9, 11, 13, 15)]
    for n, d in cands:
        length = Fraction(4 * n, d)
        if length <= max_bar_beats and (length * beat_resolution).denominator == 1:
            out.append((n, d))
    return tuple(out)


@dataclass(frozen=True)
class TokenizerConfig:
    """Everything that defines the vocabulary and the quantisation.

    ``time_signatures=()`` means the default set for ``max_bar_beats``
    (see :func:`default_time_signatures`); it is filled in at construction.
    """

    beat_resolution: int = 12
    num_velocity_bins: int = 32
    num_tempo_bins: int = 32
    tempo_min: float = 30.0
    tempo_max: float = 300.0
    max_duration_beats: int = 8
    max_bar_beats: int = 8
    time_signatures: tuple[tuple[int, int], ...] = ()
    chords: bool = False  # Chord_<root>:<quality> tokens (appended to the vocabulary)
    parts: bool = False  # Program_melody / _bridge / _piano for tracks named so (after Program_drums)
    melody_first: bool = False  # with parts: each bar's melody, then the other parts; the tempo per bar
    chord_every_bar: bool = False  # with chords and melody_first: each bar's other parts open on the chord in force
    drum_grid: bool = False  # drum hits on their nearest sixteenth or eighth-note triplet (no microtiming)
    repeats: bool = False  # with melody_first: each sweep of a bar opens on a Repeat mark (appended to the vocabulary)
    copies: bool = False  # with repeats: a sweep that copies an earlier one exactly (but its velocities) says so

    def __post_init__(self) -> None:
        # types and ranges first: the metadata of a checkpoint from elsewhere lands here, and a
        # string or a 10^9 must be named, not crash or allocate the vocabulary it implies
        for name, (lo, hi) in _TOKENIZER_INT_RANGES.items():
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or not lo <= val <= hi:
                raise ConfigError(f"tokenizer config: {name} must be an integer in {lo} … {hi:,}, not {val!r}")
        for name in ("tempo_min", "tempo_max"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 1.0 <= val <= 10_000.0:
                raise ConfigError(f"tokenizer config: {name} must be a number of BPM in 1 … 10,000, not {val!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"tokenizer config: {name} must be true or false, not {getattr(self, name)!r}")
        if self.melody_first and not self.parts:
            raise ConfigError("tokenizer config: melody_first needs parts")
        if self.chord_every_bar and not (self.chords and self.melody_first):
            raise ConfigError("tokenizer config: chord_every_bar needs chords and melody_first")
        if self.repeats and not self.melody_first:
            raise ConfigError("tokenizer config: repeats needs melody_first")
        if self.copies and not self.repeats:
            raise ConfigError("tokenizer config: copies needs repeats")
        if self.drum_grid and self.beat_resolution % 12:
            raise ConfigError("tokenizer config: drum_grid needs a beat_resolution that is a multiple of 12")
        if not self.tempo_min <= self.tempo_max:
            raise ConfigError("tokenizer config: tempo_min must not be above tempo_max")
        if self.num_tempo_bins > 1 and not self.tempo_min < self.tempo_max:
            raise ConfigError("tokenizer config: several tempo bins need tempo_min < tempo_max")
        ts = self.time_signatures
        if not ts:
            ts = default_time_signatures(self.max_bar_beats, self.beat_resolution)
        if not isinstance(ts, (tuple, list)) or len(ts) > 4096 or not all(
                isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                                     for x in t) for t in ts):
            raise ConfigError("tokenizer config: time_signatures must be a list of at most 4,096 "
                              "[numerator, denominator] integer pairs")
        ts = tuple((int(n), int(d)) for n, d in ts)
        for n, d in ts:
            if n < 1 or d < 1:
                raise ConfigError(f"tokenizer config: bad time signature {n}/{d}")
            length = Fraction(4 * n, d)
            if length > self.max_bar_beats:
                raise ConfigError(f"tokenizer config: time signature {n}/{d} is longer than max_bar_beats={self.max_bar_beats}")
            if (length * self.beat_resolution).denominator != 1:
                raise ConfigError(f"tokenizer config: time signature {n}/{d} is not a whole number of grid steps")
        if len(set(ts)) != len(ts):
            raise ConfigError("tokenizer config: duplicate time signatures")
        object.__setattr__(self, "time_signatures", ts)
        object.__setattr__(self, "tempo_min", float(self.tempo_min))
        object.__setattr__(self, "tempo_max", float(self.tempo_max))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["time_signatures"] = [list(t) for t in self.time_signatures]
        for name in _FLAGS:  # configs without them keep the fingerprint they had before they existed
            if not d[name]:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TokenizerConfig:
        if not isinstance(d, dict):
            raise ConfigError("tokenizer config must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown tokenizer config key(s): {', '.join(sorted(unknown))}")
        d = dict(d)
        if isinstance(d.get("time_signatures"), list):
            d["time_signatures"] = tuple(tuple(t) if isinstance(t, list) else t for t in d["time_signatures"])
        return cls(**d)

    def fingerprint(self) -> str:
        """Short stable hash: sha1 of the sorted JSON of the config (plus the scheme version)."""
        blob = json.dumps({"scheme": SCHEME, **self.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _duration_bins(res: int, max_beats: int) -> np.ndarray:
    top = res * max_beats
    s: set[int] = set(range(1, res + 1))
    for q in {max(1, res // 4), max(1, res // 3)}:
        s.update(range(res, 2 * res + 1, q))
    s.update(range(2 * res, 4 * res + 1, max(1, res // 2)))
    s.update(range(4 * res, top + 1, res))
    s.add(top)
    return np.array(sorted(x for x in s if x <= top), dtype=np.int64)


NOTE_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")


def _beats(steps: int, res: int) -> str:
    """Grid steps as a fraction of a beat: 18 steps at 12 per beat -> '1 1/2'."""
    f = Fraction(steps, res)
    whole, rest = divmod(f, 1)
    return " ".join(x for x in (str(whole) if whole else "", str(rest) if rest else "") if x) or "0"


@functools.lru_cache(maxsize=1)
def gm_names() -> list[str]:
    try:
        from pretty_midi.constants import INSTRUMENT_MAP

        return list(INSTRUMENT_MAP)
    except Exception:  # noqa: BLE001  # pragma: no cover - pretty_midi is a dependency
        return [f"Program {p}" for p in range(128)]


def _drum_snap(res: int) -> np.ndarray:
    """(res,): for each grid step inside a beat, the step of the nearest sixteenth or eighth-note
    triplet (res: the next beat), a tie going to the sixteenth. A drummer plays a pattern's hits a
    little early or late, so at 12 steps a beat a third of the Groove set's hits land between
    these places, and a repeated pattern never repeats on the grid (docs/groove-history.md)."""
    sixteenths, triplets = range(0, res + 1, res // 4), range(0, res + 1, res // 3)
    places = sorted({*sixteenths, *triplets}, key=lambda p: (p not in sixteenths, p))
    return np.array([min(places, key=lambda p: (abs(p - r), p not in sixteenths)) for r in range(res)])


class Vocabulary:
    """The token table of a TokenizerConfig: the bins, the time signatures, the vocabulary and its
    ids (kinds, values, ranges). REMITokenizer is one; see spemusic.tokens.tokenizer."""

    def __init__(self, config: TokenizerConfig | None = None):
        self.config = cfg = config if config is not None else TokenizerConfig()
        res = cfg.beat_resolution
        self.ticks_per_beat_out = res * TICKS_PER_STEP_OUT
        self.num_positions = cfg.max_bar_beats * res

        # bins
        nv = cfg.num_velocity_bins
        v = np.arange(128)
        self._vel_to_bin = np.clip((np.maximum(v, 1) - 1) * nv // 127, 0, nv - 1).astype(np.int64)
        self.velocity_values = np.array(
            [int((v[1:][self._vel_to_bin[1:] == b].min() + v[1:][self._vel_to_bin[1:] == b].max()) // 2) for b in range(nv)],
            dtype=np.int64,
        )
        nt = cfg.num_tempo_bins
        self._log_tmin = math.log(cfg.tempo_min)
        self._log_tstep = (math.log(cfg.tempo_max) - self._log_tmin) / (nt - 1) if nt > 1 else 1.0
        self.tempo_values = np.exp(self._log_tmin + self._log_tstep * np.arange(nt)) if nt > 1 else np.array([cfg.tempo_min])
        self.duration_steps = _duration_bins(res, cfg.max_duration_beats)
        top = int(self.duration_steps[-1])
        self.max_duration_steps = top
        table = np.abs(np.arange(top + 1)[:, None] - self.duration_steps[None, :])
        self._dur_to_bin = np.argmin(table, axis=1).astype(np.int64)  # ties -> shorter bin

        # time signatures
        self.time_signatures = cfg.time_signatures
        # grid steps in a bar of each time signature (by its index), for the grammar too
        self.bar_lengths = np.array([n * 4 * res // d for n, d in self.time_signatures], dtype=np.int64)
        self._ts_index = {ts: i for i, ts in enumerate(self.time_signatures)}
        by_len: dict[int, int] = {}
        for i, (_n, d) in enumerate(self.time_signatures):  # prefer the simplest (first listed ... quarter-based)
            L = int(self.bar_lengths[i])
            if L not in by_len or d == 4:
                by_len[L] = i
        self._ts_by_len = by_len

        # vocabulary
        vocab = ["PAD", "BOS", "EOS", "Bar"]
        kind = [PAD, BOS, EOS, BAR]
        value = [0, 1, 2, 0]
        self._ranges: dict[str, tuple[int, int]] = {}

        def add(name: str, items: Iterable[tuple[str, int]]) -> None:
            start = len(vocab)
            for s, val in items:
                vocab.append(f"{name}_{s}")
                kind.append(KINDS[name])
                value.append(val)
            self._ranges[name] = (start, len(vocab))

        add("TimeSig", ((f"{n}/{d}", i) for i, (n, d) in enumerate(self.time_signatures)))
        add("Position", ((str(p), p) for p in range(self.num_positions)))
        add("Tempo", ((str(i), i) for i in range(nt)))
        parts = [(name, code) for name, code in PART_CODES.items()] if cfg.parts else []
        add("Program", [(str(p), p) for p in range(128)] + [("drums", DRUMS)] + parts)
        add("Pitch", ((str(p), p) for p in range(128)))
        add("Velocity", ((str(i), i) for i in range(nv)))
        add("Duration", ((str(i), i) for i in range(len(self.duration_steps))))
        if cfg.chords:
            add("Chord", ((name, i) for i, name in enumerate(CHORD_NAMES)))
        if cfg.repeats:
            copies = [(f"copy{lag}", lag) for lag in REPEAT_LAGS if lag] if cfg.copies else []
            add("Repeat", [(str(lag), lag) for lag in REPEAT_LAGS] + copies)
        self.vocab: list[str] = vocab
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(vocab)}
        self.kinds = np.array(kind, dtype=np.int64)  # the kind of each id (PAD … REPEAT)
        self.kinds.flags.writeable = False
        self._kind_list = kind
        self._value_list = value
        self.pad_id, self.bos_id, self.eos_id, self.bar_id = 0, 1, 2, 3
        self.drum_program_id = self._ranges["Program"][0] + DRUMS
        self._ts_first = self._ranges["TimeSig"][0]
        self._pos_first = self._ranges["Position"][0]
        self._tempo_first = self._ranges["Tempo"][0]
        self._prog_first = self._ranges["Program"][0]
        self._pitch_first = self._ranges["Pitch"][0]
        self._vel_first = self._ranges["Velocity"][0]
        self._dur_first = self._ranges["Duration"][0]
        self._chord_first = self._ranges["Chord"][0] if cfg.chords else -1
        self._repeat_first = self._ranges["Repeat"][0] if cfg.repeats else -1
        # the lag each mark names (Repeat_0 … Repeat_8, then Repeat_copy1 … Repeat_copy8), and the first copy mark
        self.mark_lags = np.array(value[self._repeat_first:], dtype=np.int64) if cfg.repeats else np.zeros(0, np.int64)
        self._copy_first = self._repeat_first + len(REPEAT_LAGS) if cfg.copies else -1
        self._drum_snap = _drum_snap(cfg.beat_resolution) if cfg.drum_grid else None
        self._chord_index = {name: i for i, name in enumerate(CHORD_NAMES)}
        self._default_ts = self.map_time_signature(4, 4)
        # the GM program each part's track plays when decoded (a user may choose others)
        self.part_programs = {code: 0 for code in PART_CODES.values()}

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self.vocab)


    def range(self, kind: str) -> tuple[int, int]:
        """[start, stop) id range of a token kind (one of KINDS)."""
        try:
            return self._ranges[kind]
        except KeyError:
            raise ValueError(f"unknown token kind {kind!r}; expected one of {', '.join(KINDS)}") from None

    def ids_to_tokens(self, ids) -> list[str]:
        arr = np.asarray(ids, dtype=np.int64).ravel()
        bad = (arr < 0) | (arr >= len(self.vocab))
        if bad.any():
            raise TokenError(f"token id {int(arr[bad][0])} is not in the vocabulary (size {len(self.vocab)})")
        v = self.vocab
        return [v[i] for i in arr.tolist()]

    def describe(self, token_id: int) -> str:
        """What a token's bin means, in a musician's units ("91.4 BPM", "3/4 beat", "beat 2 +
        1/2", "velocity 73", "C4"); "" where the name says it all."""
        kind, value = self.vocab[token_id].split("_", 1) if "_" in self.vocab[token_id] else (self.vocab[token_id], "")
        res = self.config.beat_resolution
        if kind == "Tempo":
            return f"{float(self.tempo_values[int(value)]):.1f} BPM"
        if kind == "Duration":
            steps = int(self.duration_steps[int(value)])
            return f"{_beats(steps, res)} beat{'s' * (steps > res)}"
        if kind == "Position":
            beat, step = divmod(int(value), res)
            return f"beat {beat + 1}" + (f" + {_beats(step, res)}" if step else "")
        if kind == "Velocity":
            return f"velocity {int(self.velocity_values[int(value)])}"
        if kind == "Pitch":
            return f"{NOTE_NAMES[int(value) % 12]}{int(value) // 12 - 1}"
        if kind == "Program" and value.isdigit():
            return gm_names()[int(value)]
        return ""

    def instrument_name(self, program_id: int) -> str:
        """The General MIDI name of a Program token ("Electric Bass (finger)"), or "drums"."""
        lo, hi = self.range("Program")
        if not lo <= program_id < hi:
            raise ValueError(f"token {program_id} is not a Program token")
        code = self._value_list[program_id]
        if code in PART_OF_CODE:
            return PART_OF_CODE[code]
        return "drums" if program_id == self.drum_program_id else gm_names()[code]

    def part_id(self, part: str) -> int:
        """The Program token of a part ('melody', 'bridge', 'piano'); a tokenizer without parts
        has none (ConfigError)."""
        if not self.config.parts:
            raise ConfigError("this model's tokenizer has no parts (melody, bridge, piano)")
        return self.token_to_id[f"Program_{parse_parts(part)[0]}"]

    def tokens_to_ids(self, tokens: Iterable[str]) -> np.ndarray:
        t2i = self.token_to_id
        out = []
        for tok in tokens:
            i = t2i.get(tok)
            if i is None:
                raise TokenError(f"unknown token {tok!r}")
            out.append(i)
        return np.array(out, dtype=np.int32)

    def bar_starts(self, ids) -> np.ndarray:
        """Indices of the Bar tokens in ids."""
        return np.flatnonzero(np.asarray(ids) == self.bar_id)

    # ------------------------------------------------------------------ bins
    def velocity_bin(self, velocity):
        return self._vel_to_bin[np.clip(np.asarray(velocity, dtype=np.int64), 0, 127)]

    def duration_bin(self, steps):
        """Bin index of a duration in grid steps (>= 1); longer ones are clipped to the last bin."""
        return self._dur_to_bin[np.clip(np.asarray(steps, dtype=np.int64), 1, self.max_duration_steps)]

    def tempo_bin(self, bpm):
        b = np.asarray(bpm, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.rint((np.log(np.where(b > 0, b, 120.0)) - self._log_tmin) / self._log_tstep)
        x = np.nan_to_num(x, nan=0.0, posinf=self.config.num_tempo_bins - 1, neginf=0.0)
        return np.clip(x, 0, self.config.num_tempo_bins - 1).astype(np.int64)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - keeps at most 256 (tokenizer, signature) entries alive
    def map_time_signature(self, numerator: int, denominator: int) -> int:
        """Index into config.time_signatures of the allowed TS used for numerator/denominator."""
        ts = (int(numerator), int(denominator))
        if ts in self._ts_index:
            return self._ts_index[ts]
        if ts[0] < 1 or ts[1] < 1:
            ts = (4, 4)
            if ts in self._ts_index:
                return self._ts_index[ts]
        length = Fraction(4 * ts[0], ts[1])
        best, best_key = 0, None
        for i, (n, d) in enumerate(self.time_signatures):
            key = (abs(Fraction(4 * n, d) - length), abs(math.log2(d) - math.log2(ts[1])), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best
