"""The choices the library accepts, in one place and without importing torch: the configs check
against them, and the command line builds its option choices from them. TrainConfig, the
training options, lives here too: the command line shows its defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .errors import OptionError, SpemusicError

PE_OPTIONS = ("sinespe", "convspe", "ape", "sinusoidal", "axial", "axial-continuous", "none")
SPE_OPTIONS = ("sinespe", "convspe")
ABSOLUTE_PE_OPTIONS = ("ape", "sinusoidal", "axial", "axial-continuous")  # added to the embeddings
LENGTH_LIMITED_PE_OPTIONS = ("ape", "sinusoidal", "axial")  # defined up to max_len positions only
ATTENTION_OPTIONS = ("favor", "softmax")

MODEL_PRESETS = {  # model sizes by name: ModelConfig.preset(name, vocab_size=…)
    "tiny": dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, n_realizations=16, n_features=32,
                 n_sines=3, kernel_size=16, chunk_size=64, short_conv=4),
    "small": dict(n_layers=6, d_model=256, n_heads=8, d_ff=1024, n_realizations=64, n_features=64,
                  # chunk 64: faster training than 128 on CPU (benchmarks/train_throughput.py)
                  n_sines=5, kernel_size=64, chunk_size=64, short_conv=4),
    # the next size up from small, for a GPU's budget: more than twice its weights per token
    "medium": dict(n_layers=8, d_model=384, n_heads=8, d_ff=1536, n_realizations=64, n_features=64,
                   n_sines=5, kernel_size=64, chunk_size=64, short_conv=24),
    "paper": dict(n_layers=24, d_model=512, n_heads=8, d_ff=2048, n_realizations=64, n_features=128,
                  n_sines=5, kernel_size=128, short_conv=4),
}
PRESETS = tuple(MODEL_PRESETS)

TRAIN_PRECISIONS = ("auto", "fp32", "bf16")  # autocast in training (auto: measured, device.pick_dtype)
STEP_PRECISIONS = ("auto", "fp16", "bf16", "fp32")  # the generation step's weights (sampling.auto_step_dtype)


# what a TrainConfig field of each annotated type accepts (bool is an int to Python, not to a config)
_OPTION_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"),
                 "bool": ((bool,), "true or false"), "str": ((str,), "a string")}


LEAD_SHEET_BARS = 32  # a lead-sheet training window's melody-only opening: 1 to this many bars


@dataclass
class TrainConfig:
    data: str = ""
    preset: str = "small"
    pe: str = "sinespe"
    gated: bool = True
    attention: str = "favor"
    seq_len: int = 1024
    batch_size: int = 8          # sequences per micro-batch, all processes together
    grad_accum: int = 1          # micro-batches per optimizer step
    steps: int = 0               # optimizer steps (0: derived from epochs)
    epochs: float = 0.0
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    feature_redraw: int = 1000   # FAVOR+ features redrawn every N steps (0: never)
    val_every: int = 200
    save_every: int = 200
    log_every: int = 10
    valid_windows: int = 64
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    checkpoint_activations: bool = False  # recompute block activations in backward: less memory, ~1/3 more compute
    seed: int = 0
    transpose: int = 6
    max_len: int = 0             # positions of an absolute PE (0: max(seq_len, 2048)); SPE has no limit
    init_from: str = ""          # fine-tune: start from this model (shipped name or checkpoint), its config and tokenizer
    beats: str = ""              # folder of beat annotations for a MIDI folder DATA (bars from their downbeats)
    chords: str = ""             # folder of chord annotations (Chord tokens; a new model gets a chord vocabulary)
    parts: bool = False          # melody, bridge and piano parts by track name (a fine-tune without them gets them)
    melody_first: bool = False   # with parts: each bar's melody before the other parts (a fine-tune may switch to it)
    chord_every_bar: bool = False  # with chords and melody_first: each bar's other parts open on its chord
    drum_grid: bool = False      # drum hits on their nearest sixteenth or eighth-note triplet
    repeats: bool = False        # with melody_first: each sweep of a bar opens on a Repeat mark (a fine-tune may add them)
    copies: bool = False         # with repeats: a sweep that copies an earlier one exactly says so (a fine-tune may add them)
    lead_sheet: float = 0.0      # with parts: share of windows whose first bars keep only the melody and the chords
    piece_starts: float = 0.1    # share of windows that open at a piece's start (BOS), as generation from scratch does
    scheduled_sampling: float = 0.0  # share of note tokens (pitch, duration, velocity) fed as the model's own
                                 # draws, trained against the true next token (parallel scheduled sampling)
    kit_swaps: float = 0.0       # drums: share of windows played on another part of the kit (hats on the ride,
                                 # snare as side stick, the other crash), so the prompt names the kit, not habit
    dropout: float = -1.0        # dropout in every block and on the embeddings (-1: the preset's 0, or the
                                 # fine-tuned model's); pop-piano's lineage saw its 6M train tokens 60 times
    short_conv: int = -1         # tokens each block's short convolution reaches back (-1: the preset's, or the
                                 # fine-tuned model's; a fine-tuned model without one gets it, starting at zero)
    pitch_memory: bool = False   # every token sees the last pitch of each part (needs parts; added at zero to
                                 # a fine-tuned model without it)
    interval_head: bool = False  # each part's next pitch also scored as an interval from its last pitch (needs
                                 # parts; added at zero to a fine-tuned model without it)
    bar_echo: bool = False       # every token sees what came next at its place one bar back (added at zero)
    echo_bars: int = 1           # with bar_echo: the bars it reads back, echoing what most of them had there
    echo_head: bool = False      # the echoes 1, 2, 4 and 8 bars back also scored as the next token, by how often
                                 # each was right lately (needs the bar echo; added at zero)
    melody_head: bool = False    # the other parts' pitches scored as intervals from the melody sounding there,
                                 # the chords by the bar's melody (needs melody first and the bar echo; at zero)
    bar_clock: bool = False      # every token sees the bars since the piece began and since its melody came in,
                                 # up to 16, and since it last played, up to 8 (added at zero)
    key_head: bool = False       # the parts' pitches also scored by the pitch classes their notes have sounded
                                 # so far (needs parts; added at zero)
    recall_lr_scale: float = 10.0  # the stream features' tables learn this many times faster than the rest

    def check(self) -> None:
        one_of = "{%s} must be one of {choices} (got {value!r})"
        if self.preset not in PRESETS and not self.init_from:  # a fine-tune records its model's size
            raise OptionError(one_of % "preset", choices=", ".join(PRESETS), value=self.preset)
        if self.pe not in PE_OPTIONS:
            raise OptionError(one_of % "pe", choices=", ".join(PE_OPTIONS), value=self.pe)
        if self.attention not in ATTENTION_OPTIONS:
            raise OptionError("{attention} must be favor or softmax (got {value!r})", value=self.attention)
        if self.precision not in TRAIN_PRECISIONS:
            raise OptionError("{precision} must be auto, fp32 or bf16 (got {value!r})", value=self.precision)
        for name in ("seq_len", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise OptionError("{%s} must be at least 1" % name)
        if self.steps <= 0 and self.epochs <= 0:
            raise OptionError("give {steps} or {epochs} (a positive number)")
        if self.steps > 0 and self.epochs > 0:
            raise OptionError("give {steps} or {epochs}, not both (got {n} steps and {e} epochs)", n=self.steps,
                              e=self.epochs)
        for name in ("lr", "weight_decay", "epochs", "grad_clip", "recall_lr_scale", "lead_sheet", "piece_starts",
                     "scheduled_sampling"):
            if not math.isfinite(getattr(self, name)):
                raise OptionError("{%s} must be a finite number (got {value})" % name, value=getattr(self, name))
        if self.lr <= 0:
            raise OptionError("{lr} must be positive")
        if self.recall_lr_scale <= 0:
            raise OptionError("{recall_lr_scale} must be positive")
        if not 1 <= self.echo_bars <= 8:
            raise OptionError("{echo_bars} must be in 1 … 8 (got {value})", value=self.echo_bars)
        for name in ("warmup", "feature_redraw", "transpose"):
            if getattr(self, name) < 0:
                raise OptionError("{%s} must be at least 0" % name)
        for name in ("val_every", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise OptionError("{%s} must be at least 1" % name)
        if self.weight_decay < 0:
            raise OptionError("{weight_decay} must be at least 0")
        if not 0 <= self.lead_sheet <= 1:
            raise OptionError("{lead_sheet} must be in 0 … 1 (got {value})", value=self.lead_sheet)
        if not 0 <= self.piece_starts <= 1:
            raise OptionError("{piece_starts} must be in 0 … 1 (got {value})", value=self.piece_starts)
        if not (self.dropout == -1 or 0 <= self.dropout < 1):
            raise OptionError("{dropout} must be in [0, 1) (got {value})", value=self.dropout)
        if not 0 <= self.scheduled_sampling < 1:
            raise OptionError("{scheduled_sampling} must be in [0, 1) (got {value})", value=self.scheduled_sampling)
        if not 0 <= self.kit_swaps <= 1:
            raise OptionError("{kit_swaps} must be in 0 … 1 (got {value})", value=self.kit_swaps)
        if not 0 <= self.seed < 2**31:  # the seed is combined with step counts into a 64-bit torch seed
            raise OptionError("{seed} must be between 0 and 2^31 - 1 (got {value})", value=self.seed)
        if not -1 <= self.short_conv <= 64:
            raise OptionError("{short_conv} must be in 0 … 64 (got {value})", value=self.short_conv)
        if self.pe in ABSOLUTE_PE_OPTIONS and self.max_len and self.seq_len > self.max_len and not self.init_from:
            raise OptionError("{seq_len} {n} is past {max_len} {limit}, the positions of an absolute PE ({kind}); "
                              "SPE has no such limit", n=self.seq_len, limit=self.max_len, kind=self.pe)

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> TrainConfig:
        """Options from a TOML file (``source``), the command line or a run's record, type-checked:
        TOML has its own types, and a quoted number or a float step count must not reach training."""
        where = f" in {source}" if source else ""
        types = {f.name: f.type for f in fields(cls)}  # annotations as strings: "int", "float", ...
        unknown = set(d) - set(types)
        if unknown:
            raise SpemusicError(f"unknown training option(s){where}: {', '.join(sorted(unknown))}")
        for name, value in d.items():
            accepted, expected = _OPTION_TYPES[types[name]]
            if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
                raise SpemusicError(f"training option {name}{where} must be {expected}, not {value!r}")
        return cls(**d)


# Sampling defaults of every model, chosen by benchmarks/music_metrics.py: pure sampling of the
# notes (a nucleus stacked notes at an onset and left holes), and a nucleus at the bar line, where
# a meter change sampled from the tail would hold for many bars. Then each shipped model's own, by
# the name it was released under (its checkpoint's info["name"]); docs/sampling.md says why.
# the chord-tone bias of --chords (sampling.chord_tones), in nats: the models alone follow chord tokens weakly
CHORD_STRENGTH = 2.0
SAMPLING_DEFAULTS = dict(top_p=1.0, bar_top_p=0.8, onset_top_p=1.0, repeat=0.0, hole_penalty=0.0, stacking=1.0,
                         follow_repeats=0.0)
MODEL_SAMPLING = {
    # groove's continuations keep closer to their prompt's style with the unlikely hits cut: one
    # stray hit and the model takes the bar for a fill (benchmarks/groove_drift.py)
    "groove": dict(top_p=0.8, bar_top_p=0.8),
    # pop-piano leaves fewer holes with the far onsets cut and the onsets that would leave a hole
    # discouraged, and stacks as many notes per onset with the odds of a third note and more
    # tempered. The continuous cache (--repeat) is off: with parts it made the melody repeat its
    # own notes instead of moving by steps. A bar its repeat mark calls like an earlier one keeps
    # to that bar's notes (drawn alone, a fifth of those bars came out alike)
    "pop-piano": dict(onset_top_p=0.9, hole_penalty=4.0, stacking=0.8, follow_repeats=6.0),
}


def model_sampling(name: str | None, own: dict | None = None, **asked) -> dict:
    """The values of SAMPLING_DEFAULTS' keys for a model released as `name`: those `asked` (None:
    not given), else the defaults its checkpoint records (`own`, written by release), else
    MODEL_SAMPLING's for its name (models released before checkpoints recorded them), else every
    model's."""
    defaults = {**SAMPLING_DEFAULTS, **MODEL_SAMPLING.get(name or "", {}), **(own or {})}
    return {k: defaults[k] if asked.get(k) is None else asked[k] for k in SAMPLING_DEFAULTS}


def recorded_sampling(value, source: str) -> dict | None:
    """A checkpoint's recorded sampling defaults (its info's "sampling"), checked: None where it
    records none; a one-line error naming `source` where they are not SAMPLING_DEFAULTS' keys
    with finite numbers."""
    if value is None:
        return None
    if not isinstance(value, dict) or any(k not in SAMPLING_DEFAULTS for k in value) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value.values()):
        raise SpemusicError(f"{source}: its sampling defaults are not {', '.join(SAMPLING_DEFAULTS)} with numbers "
                            f"(got {value!r:.80})")
    return {k: float(v) for k, v in value.items()}


def check_layout(parts: bool, melody_first: bool, chords: bool, chord_every_bar: bool, repeats: bool = False,
                 copies: bool = False) -> None:
    """The token layouts a new tokenizer may be asked for, as an error that names the options."""
    if melody_first and not parts:
        raise OptionError("{melody_first} needs {parts}")
    if repeats and not melody_first:
        raise OptionError("{repeats} needs {melody_first}")
    if copies and not repeats:
        raise OptionError("{copies} needs {repeats}")
    if chord_every_bar and not (melody_first and chords):
        raise OptionError("{chord_every_bar} needs {melody_first} and {chords}")
