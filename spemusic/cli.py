"""The `spemusic` command line: a thin typer layer over the package's functions."""

from __future__ import annotations

import errno
import json
import math
import signal
import sys
import threading
import time
from dataclasses import replace
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__
from ._start import import_native_libraries
from .errors import OptionError, SpemusicError
from .options import (
    ATTENTION_OPTIONS,
    CHORD_STRENGTH,
    LEAD_SHEET_BARS,
    MODEL_PRESETS,
    MODEL_SAMPLING,
    PE_OPTIONS,
    PRESETS,
    SAMPLING_DEFAULTS,
    STEP_PRECISIONS,
    TRAIN_PRECISIONS,
    TrainConfig,
)
from .words import count, verb

# typer prints a <bool> type placeholder after every flag (--overwrite <bool>), as if it took a
# value; flags take none, so their type column stays empty
_display_type_rich = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else _display_type_rich(self, ctx)

# --help lists the commands that make music first, then the workshop
COMMAND_ORDER = ("generate", "continue", "accompany", "render", "show", "play", "train", "eval", "tokenize",
                 "detokenize", "data", "models")


class _Commands(typer.core.TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: COMMAND_ORDER.index(n) if n in COMMAND_ORDER else len(COMMAND_ORDER))


app = typer.Typer(
    cls=_Commands,
    help="Symbolic music generation with long-context Performers and Stochastic Positional Encoding.\n\n"
         "Make music with the shipped model:  spemusic generate --length 4096 -o song.mid",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]})
data_app = typer.Typer(help="Prepare token caches of MIDI collections.", no_args_is_help=True,
                       context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(data_app, name="data")
err = Console(stderr=True, soft_wrap=True, emoji=False)  # ":100:" in a message is text, not 💯
out = Console(emoji=False)


def _version(value: bool) -> None:
    if value:
        print(f"spemusic {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    pass


class _LazyProgress(Progress):
    """A progress display that starts drawing at its first task, so that an error raised before
    (a bad path, say) is not preceded by an empty progress line."""

    def __enter__(self) -> _LazyProgress:
        return self

    def add_task(self, *args, **kwargs):
        if not self.live.is_started:
            self.start()
        return super().add_task(*args, **kwargs)

    def __exit__(self, *exc) -> None:
        if self.live.is_started:  # (Progress.stop prints a newline when not on a terminal)
            self.stop()


def _progress(*columns, disable: bool = False) -> Progress:
    return _LazyProgress(*columns, console=err, disable=disable, transient=False)


_FLAGS = {"data": "DATA", "output": "-o", "run_dir": "-o", "config": "--config", "to_stdout": "--stdout"}


def _flag(name: str) -> str:
    """How the command line writes an option the library names by parameter (seq_len: --seq-len)."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _message(e: SpemusicError) -> str:
    """An error's message as the command line says it: options named by parameter become flags."""
    return e.spelled(_flag) if isinstance(e, OptionError) else str(e)


def _set_threads(threads: int | None, default: int | None = None) -> None:
    """--threads N, else OMP_NUM_THREADS when set (torch reads it), else `default` (None: torch's)."""
    import os

    import torch

    if threads is not None:
        if threads < 1:
            raise SpemusicError(f"--threads must be at least 1 (got {threads})")
        torch.set_num_threads(threads)
    elif default is not None and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(default)


AS_FOLDER = " (./NAME: a folder named like a shipped model)"  # a bare shipped name is the shipped model
def _sampling_default(key: str) -> str:
    """'[default: …]' of a sampling option, from SAMPLING_DEFAULTS and MODEL_SAMPLING (spemusic.options)."""
    by_model = [f"{defaults[key]:g} for {name}" for name, defaults in MODEL_SAMPLING.items() if key in defaults]
    return f"\\[default: {'; '.join([f'{SAMPLING_DEFAULTS[key]:g}', *by_model])}]"


TOP_P_HELP = "Nucleus sampling mass in (0, 1]; 1 turns it off. " + _sampling_default("top_p")
BAR_TOP_P_HELP = ("Nucleus mass at each bar line over keeping the meter and tempo against each change of them: "
                  "0.8 keeps them unless the model is sure of a change (where the bar's first note falls stays "
                  "the model's choice); 1 turns it off. "
                  + _sampling_default("bar_top_p"))
ONSET_TOP_P_HELP = ("Nucleus mass among the places the next onset may take after a note (the positions and the "
                    "bar line; whether another note comes at the same onset stays the model's choice): below 1 "
                    "cuts the far onsets of the tail, which leave holes. " + _sampling_default("onset_top_p"))
REPEAT_HELP = ("How strongly a piece repeats its earlier bars, 0 to 1: the share a continuous cache of the piece's "
               "own hidden states may take where the model is somewhere it has been before (0: the model alone). "
               + _sampling_default("repeat"))
HOLE_PENALTY_HELP = ("Nats taken off the chance of each next onset per beat of silence it would leave (beyond a "
                     "quarter beat, after every note has ended); 0 turns it off. " + _sampling_default("hole_penalty"))
FOLLOW_REPEATS_HELP = ("Nats added, in a bar whose repeat mark calls it like an earlier bar (not a copy), to the "
                      "token that bar wrote at the same place: the model chose the repeat, this keeps its notes to "
                      "it; 0 turns it off (models with repeat marks). " + _sampling_default("follow_repeats"))
STACKING_HELP = ("Once an onset holds two notes, the odds of one more note there are multiplied by this (below 1: "
                 "fewer stacked notes); 1 turns it off. " + _sampling_default("stacking"))

def _sampling_options(info: dict, temperature: float, top_k: int, **asked):
    """The sampling options asked for (None: not given), the model's defaults where none was given."""
    from .generation.sampling import SamplingOptions

    return SamplingOptions.for_model(info.get("name"), temperature=temperature, top_k=top_k, own=info.get("sampling"),
                                     **asked)
INTERRUPTED_AND_SAID = 1130  # exit code 130, after a command's own message about the interruption
THREADS_HELP = "CPU threads \\[default: OMP_NUM_THREADS when set, else "


# ----------------------------------------------------------------------------- tokenize / detokenize

def _expand_inputs(inputs: list[Path], suffixes: set[str]) -> tuple[list[tuple[Path, Path]], bool]:
    """(file, base folder) pairs; folders are searched recursively. Returns (pairs, folder_mode)."""
    from .files import check_input_file

    pairs, folder_mode = [], len(inputs) > 1
    for p in inputs:
        if p.is_dir():
            folder_mode = True
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in suffixes)
            if not found:
                raise SpemusicError(f"{p}: no {'/'.join(sorted(suffixes))} files found")
            pairs += [(f, p) for f in found]
        else:
            pairs.append((check_input_file(p, missing="no such file or folder"), p.parent))
    return pairs, folder_mode


def _convert_many(inputs, output, suffixes, new_suffix, convert, what: str, overwrite: bool) -> None:
    from .files import check_output_file, check_output_folder, names_new_folder

    pairs, folder_mode = _expand_inputs(inputs, suffixes)
    new_folder = output is not None and names_new_folder(output)
    output = Path(output) if output is not None else None
    if not folder_mode:
        src = pairs[0][0]
        dest = output or src.with_suffix(new_suffix)
        if new_folder:  # convert() writes through write_output, which makes it
            check_output_folder(dest)
            dest = dest / (src.stem + new_suffix)
        else:
            if dest.is_dir():
                dest = dest / (src.stem + new_suffix)
            if dest.resolve() == src.resolve():
                raise SpemusicError(f"{dest}: is the input itself; give another -o")
            check_output_file(dest, overwrite)
        convert(src, dest, overwrite)
        err.print(f"{what} {src} -> {dest}")
        return
    if output is None:
        raise SpemusicError("several inputs or a folder: give -o OUTPUT_FOLDER")
    check_output_folder(output)
    jobs = []
    for src, base in pairs:
        rel = src.relative_to(base) if base in src.parents else Path(src.name)
        jobs.append((src, output / rel.with_suffix(new_suffix)))
    sources: dict[Path, Path] = {}
    for src, dest in jobs:
        if dest in sources:
            raise SpemusicError(f"{sources[dest]} and {src} would both be written to {dest}; convert them separately")
        sources[dest] = src
    existing = [dest for _, dest in jobs if dest.exists()]
    if existing and not overwrite:
        raise SpemusicError(f"{len(existing)} of the {len(jobs)} outputs already exist in {output} (first: "
                            f"{existing[0]}); use --overwrite to replace them")
    failures = []
    with _progress(TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        task = progress.add_task(what, total=len(pairs))
        for src, dest in jobs:
            try:
                convert(src, dest, overwrite)
            except SpemusicError as e:
                failures.append(_message(e))
            progress.advance(task)
    for f in failures:
        err.print(f"[yellow]skipped:[/] {escape(f)}", highlight=False)
    err.print(f"{len(pairs) - len(failures)} of {count(len(pairs), 'file')} written to {output}"
              + (f", {len(failures)} skipped" if failures else ""))
    if len(failures) == len(pairs):  # nothing written is a failure; some written is a success with its skip list
        raise SpemusicError(f"no file written: all {len(pairs)} inputs were skipped" if len(pairs) > 1 else
                            "no file written: the input was skipped")


@app.command()
def tokenize(
    inputs: list[Path] = typer.Argument(..., help="MIDI files or folders (searched recursively)."),
    output: str | None = typer.Option(None, "-o", "--output", help="Output .txt file, or folder (for several "
                                          "inputs, or a name ending in /). \\[default: the input's name with .txt, next to it]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
    beats: Path | None = typer.Option(None, "--beats", help="Beat annotation (a file; for folders, a folder of "
                                         "them matched by relative path or stem): bars from its downbeats."),
    chords: Path | None = typer.Option(None, "--chords", help="Chord annotation (file or folder, as --beats): "
                                          "Chord tokens at its chord changes."),
):
    """Turn MIDI files into readable REMI tokens, one per line.

    Examples:

    spemusic tokenize data/examples/piano.mid -o piano.txt

    spemusic tokenize my_midis/ -o my_tokens/

    spemusic tokenize ../shared/data/pop909/001.mid --beats ../shared/data/pop909/beats/001.txt -o 001.txt
    """
    import_native_libraries(with_torch=False)
    from .files import check_input_file, write_output
    from .tokens.tokenizer import REMITokenizer, TokenizerConfig
    from .training.data import BEAT_SUFFIXES, CHORD_SUFFIXES, find_annotation

    # Chord tokens where an annotation or chord markers give them, parts where tracks are named so
    tok = REMITokenizer(TokenizerConfig(chords=True, parts=True))
    for given, what in ((beats, "--beats"), (chords, "--chords")):
        if given is not None and not given.is_dir():
            check_input_file(given, missing=f"no such file or folder ({what})")

    def annotation(src: Path, given: Path | None, suffixes) -> Path | None:
        if given is None or given.is_file():
            return given
        for root in inputs:  # a folder of annotations: matched like `data prepare` does
            if root.is_dir() and root in src.parents:
                return find_annotation(given, src.relative_to(root).as_posix(), suffixes)
        return find_annotation(given, src.name, suffixes)

    def convert(src: Path, dest: Path, overwrite: bool) -> None:
        ids, stats = tok.encode_with_stats(src, beats=annotation(src, beats, BEAT_SUFFIXES),
                                           chords=annotation(src, chords, CHORD_SUFFIXES))
        for warning in stats["warnings"]:  # what the reader policy skipped or clipped
            err.print(f"[yellow]warning:[/] {escape(str(src))}: {escape(warning)}", highlight=False)
        lines = []
        for i, name in zip(ids.tolist(), tok.ids_to_tokens(ids)):
            meaning = tok.describe(i)  # what the bin means, after the token: readers take the first field
            lines.append(f"{name:<16} ; {meaning}" if meaning else name)
        write_output(("\n".join(lines) + "\n").encode(), dest, overwrite)

    _convert_many(inputs, output, {".mid", ".midi"}, ".txt", convert, "tokenized", overwrite)


@app.command()
def show(
    inputs: list[Path] = typer.Argument(..., help="MIDI files or folders (searched recursively)."),
    output: str | None = typer.Option(None, "-o", "--output", help="Output .png, .svg or .pdf, or a folder (for "
                                          "several inputs, or a name ending in /). \\[default: the input's name with "
                                          ".png, next to it]"),
    bars: str | None = typer.Option(None, "--bars", help="Only bars A to B (from 1, inclusive): 1:16, 9: or :8."),
    beats: Path | None = typer.Option(None, "--beats", help="Beat annotation (POP909's beat_midi format): draw the "
                                         "annotated bars, not the file's time signatures. For folders, a folder of "
                                         "them, matched by name."),
    size: str | None = typer.Option(None, "--size", help="WIDTHxHEIGHT in pixels \\[default: 64 pixels per bar, "
                                       "900 to 8000 wide]"),
    fmt: str = typer.Option("png", "--format", help="png, svg or pdf, for folders (a file's -o suffix decides)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
):
    """Draw piano rolls: bars and beats across, pitches up, one colour per track, drums on named rows.

    Examples:

    spemusic show generated.mid

    spemusic show song-continued.mid --bars 1:24 -o song.svg

    spemusic show ../shared/data/pop909/001.mid --beats ../shared/data/pop909/beats/001.txt --bars 1:16

    spemusic show sketches/ -o rolls/
    """
    import_native_libraries(with_torch=False)
    from .music.pianoroll import FORMATS, draw_file, parse_bar_range, parse_size

    bar_range = parse_bar_range(bars) if bars is not None else None
    pixels = parse_size(size) if size is not None else None
    suffix = "." + fmt.lower().lstrip(".")
    if suffix not in FORMATS:
        raise SpemusicError(f"--format {fmt}: use png, svg or pdf")
    if output is not None and Path(output).suffix.lower() in FORMATS:
        suffix = Path(output).suffix.lower()
    def beats_of(src: Path) -> Path | None:
        return beats / f"{src.stem}.txt" if beats is not None and beats.is_dir() else beats

    _convert_many(inputs, output, {".mid", ".midi"}, suffix,
                  lambda src, dest, overwrite: draw_file(src, dest, bar_range, pixels, overwrite, beats_of(src)),
                  "drew", overwrite)


@app.command("render")
def render_(
    inputs: list[Path] = typer.Argument(..., help="MIDI files or folders (searched recursively)."),
    output: str | None = typer.Option(None, "-o", "--output", help="Output .wav, .flac, .ogg or .mp3, or a folder "
                                          "(for several inputs, or a name ending in /). \\[default: the input's name "
                                          "with .wav, next to it]"),
    soundfont: Path | None = typer.Option(None, "--soundfont", help="General MIDI SoundFont (.sf2) \\[default: "
                                             "$SPEMUSIC_SOUNDFONT, then /usr/share/sounds/sf2/ and the like, then "
                                             "pretty_midi's small TimGM6mb]"),
    sample_rate: int = typer.Option(44100, "--sample-rate", min=8000, max=192000, help="Samples per second."),
    fmt: str = typer.Option("wav", "--format", help="wav, flac, ogg or mp3, for folders (a file's -o suffix decides)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
):
    """Render MIDI files to audio with a General MIDI SoundFont (stereo, peak at -1 dBFS).

    Examples:

    spemusic render generated.mid

    spemusic render song.mid -o song.flac --soundfont ~/sf2/MuseScore_General.sf2

    spemusic render sketches/ -o audio/ --format mp3
    """
    import_native_libraries(with_torch=False)
    from .music.audio import AUDIO_FORMATS, check_audio_format, find_soundfont, render_file

    suffix = "." + fmt.lower().lstrip(".")
    if suffix not in AUDIO_FORMATS:
        raise SpemusicError(f"--format {fmt}: use {', '.join(s.lstrip('.') for s in AUDIO_FORMATS)}")
    if output is not None and Path(output).suffix.lower() in AUDIO_FORMATS:
        suffix = Path(output).suffix.lower()
    named = output is not None and Path(output).suffix.lower() in AUDIO_FORMATS
    check_audio_format(Path("out" + suffix), sample_rate, f"-o {output}" if named else f"--format {suffix[1:]}")
    font = find_soundfont(soundfont)
    _convert_many(inputs, output, {".mid", ".midi"}, suffix,
                  lambda src, dest, overwrite: render_file(src, dest, font, sample_rate, overwrite),
                  f"rendered with {font.name}", overwrite)


@app.command()
def detokenize(
    inputs: list[Path] = typer.Argument(..., help="Token files (.txt, one token per line) or folders."),
    output: str | None = typer.Option(None, "-o", "--output", help="Output .mid file, or folder (for several "
                                          "inputs, or a name ending in /). \\[default: the input's name with .mid, next to it]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
    keep_overlaps: bool = typer.Option(False, "--keep-overlaps", help="Keep notes that overlap an earlier one of "
                                       "the same pitch whole, on extra layer tracks (lossless; default: the later "
                                       "note ends the earlier one, as MIDI players do)."),
):
    """Turn readable REMI tokens back into MIDI files.

    Examples:

    spemusic detokenize piano.txt -o piano_again.mid

    spemusic detokenize my_tokens/ -o my_midis_again/
    """
    import_native_libraries(with_torch=False)
    from .files import write_output
    from .tokens.grammar import REMIGrammar
    from .tokens.tokenizer import REMITokenizer, TokenizerConfig

    tok = REMITokenizer(TokenizerConfig(chords=True, parts=True))  # reads token files with or without chords, parts
    grammar = REMIGrammar(tok)

    def convert(src: Path, dest: Path, overwrite: bool) -> None:
        try:
            # one token per line: its first field (what follows, "; 91.4 BPM", is for people)
            numbered = [(n, line.split()[0]) for n, line in enumerate(src.read_text().splitlines(), 1) if line.strip()]
        except UnicodeDecodeError:
            raise SpemusicError(f"{src}: not a token text file (binary content)") from None
        if not numbered:
            raise SpemusicError(f"{src}: empty token file")
        try:
            ids = tok.tokens_to_ids([t for _, t in numbered])
        except (ValueError, KeyError) as e:
            raise SpemusicError(f"{src}: {e}") from None
        score, stats = tok.decode_with_stats(ids, "layers" if keep_overlaps else "trim")
        lost = stats["lost_notes"]
        if lost:  # say so, and where the tokens first leave the grammar, rather than drop them silently
            bad = grammar.first_violation(ids)
            where = (f"; the tokens first leave the REMI grammar at line {numbered[bad][0]} ({numbered[bad][1]})"
                     if bad is not None else "")
            err.print(f"[yellow]warning:[/] {escape(str(src))}: {lost} of {count(lost + stats['notes'], 'note')} could "
                      f"not be formed: skipped{escape(where)}", highlight=False)
        write_output(score.dumps_midi(), dest, overwrite)

    _convert_many(inputs, output, {".txt"}, ".mid", convert, "detokenized", overwrite)


# ----------------------------------------------------------------------------- data prepare

@data_app.command("prepare")
def data_prepare(
    midi_dir: Path = typer.Argument(..., help="Folder of MIDI files (searched recursively)."),
    output: Path = typer.Option(..., "-o", "--output", help="Cache folder to write."),
    split_csv: Path | None = typer.Option(None, "--split-csv", help="CSV with midi_filename and split columns "
                                             "(default: MIDI_DIR/info.csv when present, else a hash of the path)."),
    workers: int = typer.Option(0, "--workers", min=0, help="Tokenizer processes (0: one per CPU core)."),
    beats: Path | None = typer.Option(None, "--beats", help="Folder of beat annotations (song.txt beside "
                                         "song.mid, by relative path or stem): bars from their downbeats."),
    chords: Path | None = typer.Option(None, "--chords", help="Folder of chord annotations (start end label, "
                                          "Harte notation), written as Chord tokens."),
    parts: bool = typer.Option(False, "--parts/--no-parts", help="Keep the melody, bridge and piano parts apart "
                               "(tracks named MELODY, BRIDGE, PIANO, as in POP909)."),
    melody_first: bool = typer.Option(False, "--melody-first/--no-melody-first", help="With --parts: each bar's "
                                      "melody before the other parts."),
    chord_every_bar: bool = typer.Option(False, "--chord-every-bar/--no-chord-every-bar", help="With "
                                         "--melody-first and --chords: each bar's other parts open on the chord "
                                         "in force there."),
    drum_grid: bool = typer.Option(False, "--drum-grid/--no-drum-grid", help="Each drum hit on its nearest "
                                   "sixteenth or eighth-note triplet (no microtiming)."),
    repeats: bool = typer.Option(False, "--repeats/--no-repeats", help="With --melody-first: each bar's melody "
                                 "and its other parts open on a mark naming the bar they repeat (1, 2, 4 or 8 "
                                 "back, or none)."),
    copies: bool = typer.Option(False, "--copies/--no-copies", help="With --repeats: a bar's melody or other "
                                "parts that copy those of 1, 2, 4 or 8 bars back exactly (velocities aside) open "
                                "on a copy mark, and a model that writes one writes the copy."),
):
    """Tokenize a MIDI collection into a compact cache with train/valid/test splits.

    Examples:

    spemusic data prepare ../shared/data/pop909 -o cache/pop909

    spemusic data prepare ../shared/data/pop909 -o cache/pop909-v3 --parts --beats ../shared/data/pop909/beats --chords ../shared/data/pop909/chords
    """  # noqa: E501 - typer prints the lines of a command's docstring as they are: one example a line
    import_native_libraries(with_torch=False)
    from .options import check_layout
    from .tokens.tokenizer import TokenizerConfig
    from .training.data import prepare

    check_layout(parts, melody_first, chords is not None, chord_every_bar, repeats, copies)

    with _progress(TextColumn("[bold]tokenizing"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                   TimeElapsedColumn(), TimeRemainingColumn()) as progress:
        t0 = time.perf_counter()
        cache, reused = prepare(midi_dir, output, TokenizerConfig(chords=chords is not None, parts=parts,
                                                              melody_first=melody_first,
                                                              chord_every_bar=chord_every_bar,
                                                              drum_grid=drum_grid, repeats=repeats,
                                                              copies=copies),
                                split_csv=split_csv, workers=workers or None, progress=progress,
                                beats_dir=beats, chords_dir=chords)
        wall = time.perf_counter() - t0
    idx = cache.index
    table = Table(title=f"{cache.path}" + (" (reused: source unchanged)" if reused else f" ({wall:.1f} s)"))
    for col in ("split", "files", "tokens", "tokens/file"):
        table.add_column(col, justify="right" if col != "split" else "left")
    for split, c in idx["splits"].items():
        table.add_row(split, f"{c['files']:,}", f"{c['tokens']:,}", f"{c['tokens'] / max(c['files'], 1):,.0f}")
    total_files = sum(c["files"] for c in idx["splits"].values())
    total_tokens = sum(c["tokens"] for c in idx["splits"].values())
    table.add_row("all", f"{total_files:,}", f"{total_tokens:,}", f"{total_tokens / max(total_files, 1):,.0f}")
    out.print(table)
    annotated = idx.get("annotated") or {}
    for what in ("beats", "chords"):
        if idx.get(what):
            out.print(f"{what}: {annotated.get(what, 0)} of {count(total_files, 'file')} annotated; "
                      f"{total_files - annotated.get(what, 0)} without "
                      f"({'their own meter' if what == 'beats' else 'no chord tokens'})")
    out.print(f"skipped files: {len(idx['skipped'])}; vocabulary coverage: {idx['vocab_used']} of "
              f"{idx['vocab_size']} tokens used ({100 * idx['vocab_used'] / idx['vocab_size']:.0f}%)")
    for s in idx["skipped"][:20]:
        out.print(f"  skipped {s['path']}: {s['reason']}", highlight=False)
    if len(idx["skipped"]) > 20:
        out.print(f"  … and {len(idx['skipped']) - 20} more (see {cache.path / 'index.json'})")


# ----------------------------------------------------------------------------- train

def _choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A typer choice type of the values the library defines (one list, in nn/model.py or nn/device.py)."""
    return Enum(name, {v: v for v in values}, type=str)


Preset = _choices("Preset", PRESETS)
PE = _choices("PE", PE_OPTIONS)
Attention = _choices("Attention", ATTENTION_OPTIONS)
Precision = _choices("Precision", TRAIN_PRECISIONS)
StepPrecision = _choices("StepPrecision", STEP_PRECISIONS)


# the sampling options generate, continue and accompany share (one typer option each, reused)
TEMPERATURE_OPTION = typer.Option(1.0, help="Softmax temperature (> 0).")
TOP_P_OPTION = typer.Option(None, "--top-p", help=TOP_P_HELP)
BAR_TOP_P_OPTION = typer.Option(None, "--bar-top-p", help=BAR_TOP_P_HELP)
ONSET_TOP_P_OPTION = typer.Option(None, "--onset-top-p", help=ONSET_TOP_P_HELP)
REPEAT_OPTION = typer.Option(None, "--repeat", help=REPEAT_HELP)
HOLE_PENALTY_OPTION = typer.Option(None, "--hole-penalty", help=HOLE_PENALTY_HELP)
STACKING_OPTION = typer.Option(None, "--stacking", help=STACKING_HELP)
FOLLOW_REPEATS_OPTION = typer.Option(None, "--follow-repeats", help=FOLLOW_REPEATS_HELP)
TOP_K_OPTION = typer.Option(0, "--top-k", help="Keep the K most likely tokens; 0 turns it off.")
SEED_OPTION = typer.Option(None, help="Random seed: same seed, options and model give the same file. "
                          "\\[default: a new one, printed]")

PART_PROGRAMS_OPTION = typer.Option(None, "--part-programs", help="The GM program each part's track plays, e.g. "
                                    "melody=73,bridge=48 (flute, strings) \\[default: piano]")
PARTS_HELP = "Parts to play, comma-separated: melody, bridge, piano (models with parts, such as pop-piano)."

STEP_PRECISION_HELP = ("Weights of the generation step. Half precision reads half the bytes per token (faster "
                       "on a CPU) and leaves the NLL unchanged to 1e-4 nats; fp32 is exact. auto: fp16, "
                       "or bf16 from --num 8 on a CPU with native bf16.")


# train's options that are TrainConfig fields: (help panel, text[, the default as shown]); the
# help appends "[default: …]" from TrainConfig itself, unless the third item says otherwise (None:
# no default shown)
TRAIN_OPTIONS = {
    "preset": ("Model", "Model size."),
    "pe": ("Model", "Positional encoding."),
    "gated": ("Model", "Gated SPE."),
    "attention": ("Model", "favor (linear) or softmax (quadratic baseline)."),
    "dropout": ("Model", ("Dropout in every block and on the embeddings (training only): a small dataset seen "
                "many times is learned by heart without it."), "0, or the --init-from model's"),
    "short_conv": ("Model", ("Tokens each block's short causal convolution reaches back (0: none). Added to an "
                   "--init-from model that has none, or widened (farther taps at zero)."),
                   f"{MODEL_PRESETS['small']['short_conv']}, or the --init-from model's"),
    "pitch_memory": ("Model", ("Every token also sees the last pitch each part (melody, bridge, piano) wrote: "
                     "melodic intervals at any distance. Needs --parts; added to an --init-from model at zero.")),
    "interval_head": ("Model", ("Each part's next pitch is also scored as an interval from that part's last pitch "
                      "(a melody's steps and leaps at any distance). Needs --parts; added to an --init-from "
                      "model at zero.")),
    "bar_echo": ("Model", ("Every token also sees what came next at its place in the bar before (a drummer's "
                 "pattern, an accompaniment's figure). Added to an --init-from model at zero.")),
    "echo_bars": ("Model", ("With --bar-echo: the bars it reads back. Each token sees what most of them had at "
                  "its place (ties: the nearest bar), so a slip in one bar does not carry forward.")),
    "echo_head": ("Model", ("The tokens that followed the same place 1, 2, 4 and 8 bars back are also scored as "
                  "the next token, each by how many of the last 16 tokens its lag named right: a repeated "
                  "phrase or a held pattern is copied once it holds. Needs --bar-echo or a model with it; "
                  "added to an --init-from model at zero.")),
    "melody_head": ("Model", ("The bridge's and the piano's pitches are also scored as intervals from the melody "
                    "note sounding there, and each bar's chord by the melody's pitch classes (the accompaniment "
                    "follows the melody it cannot otherwise read sharply). Needs --melody-first and --bar-echo "
                    "or a model with it; added to an --init-from model at zero.")),
    "bar_clock": ("Model", ("Every token also sees how many bars the piece has had, up to 16, and with parts how "
                  "many since its melody came in and since it last played (a song opens on an intro; a training "
                  "window from inside a song reads as one well into it). Added to an --init-from model at zero.")),
    "key_head": ("Model", ("Each part's pitches are also scored by how often each pitch class has sounded in "
                 "the parts' notes so far (the piece's key, counted exactly: fewer notes outside it). Needs "
                 "--parts; added to an --init-from model at zero.")),
    "recall_lr_scale": ("Optimisation", ("The --pitch-memory, --bar-echo and --bar-clock tables learn this many "
                        "times faster than the rest (they start at zero).")),
    "max_len": ("Model", ("Longest sequence of an absolute PE (ape, sinusoidal, axial; axial-continuous is scaled "
                "to it) at generation/eval; SPE has "
                "no limit."), "max(seq-len, 2048)"),
    "init_from": ("Model", ("Fine-tune: start from this model (a shipped name or a checkpoint), with its size, PE "
                  "and tokenizer."), None),
    "seq_len": ("Data", "Training window in tokens."),
    "beats": ("Data", ("Folder of beat annotations for a MIDI folder DATA (as for `data prepare`): bars from their "
              "downbeats."), None),
    "chords": ("Data", ("Folder of chord annotations for a MIDI folder DATA: Chord tokens (a new model gets them in "
               "its vocabulary)."), None),
    "parts": ("Data", ("Keep the melody, bridge and piano parts apart (tracks named MELODY, BRIDGE, PIANO, as in "
              "POP909); an --init-from model without them gets them in its vocabulary.")),
    "melody_first": ("Data", ("With --parts, write each bar's melody before the other parts, so the accompaniment "
                     "and its chords see the whole bar's melody (an --init-from model may switch to it).")),
    "chord_every_bar": ("Data", ("With --melody-first and chords, open each bar's other parts on the chord in "
                        "force there, so the model names every bar's harmony after hearing its melody (an "
                        "--init-from model may switch to it).")),
    "drum_grid": ("Data", ("Put each drum hit on its nearest sixteenth or eighth-note triplet, without the "
                  "drummer's microtiming, so that a pattern repeats on the grid (an --init-from model may switch to "
                  "it).")),
    "repeats": ("Data", ("With --melody-first, open each bar's melody and its other parts on a mark naming the bar "
                "they repeat (1, 2, 4 or 8 back, or none), read off the notes: the model chooses a repeat before "
                "its notes (an --init-from model may add them).")),
    "copies": ("Data", ("With --repeats, open a bar's melody or other parts that copy those of 1, 2, 4 or 8 bars "
               "back exactly (velocities aside) on a copy mark: a model that writes one writes the copy, so a "
               "repeat is one choice (an --init-from model may add them).")),
    "lead_sheet": ("Data", (f"With parts: this share of the training windows has its first 1 to {LEAD_SHEET_BARS} "
                   "bars as a lead sheet (the melody and the chords, no other part), so the model learns to "
                   "accompany a melody it is given.")),
    "piece_starts": ("Data", ("This share of the training windows opens at a piece's start, as generation from "
                     "scratch does; the rest open at any bar. A model with --bar-echo holds the bars it opens "
                     "with, so it needs more of them.")),
    "scheduled_sampling": ("Data", ("This share of the windows' note tokens (pitch, duration, velocity) is fed as "
                           "the model's own draw, trained against the true next token, so the model learns to go on "
                           "after a token of its own that differs, as when it samples (one more forward pass a step; on "
                           "pop-piano its melodies leapt more, docs/design.md).")),
    "kit_swaps": ("Data", ("Drums: this share of the training windows is played on another part of the kit, the "
                  "same way through the window (hi-hat on the ride, snare as side stick, one crash for the "
                  "other), so a continuation keeps the kit of its prompt.")),
    "batch_size": ("Optimisation", "Sequences per micro-batch, all processes together."),
    "grad_accum": ("Optimisation", "Micro-batches per optimizer step."),
    "steps": ("Optimisation", "Optimizer steps.", None),
    "epochs": ("Optimisation", "Passes over the train split's tokens (instead of --steps).", None),
    "lr": ("Optimisation", "Peak learning rate."),
    "warmup": ("Optimisation", "Linear warmup steps, then cosine decay."),
    "weight_decay": ("Optimisation", ("AdamW weight decay, on the weight matrices (not on embeddings, gains, biases "
                     "or the positional encoding).")),
    "feature_redraw": ("Optimisation", "Redraw FAVOR+ features every N steps (0: never)."),
    "seed": ("Optimisation", "Random seed."),
    "val_every": ("Run", "Validate every N steps."),
    "save_every": ("Run", "Save `last` every N steps."),
    "log_every": ("Run", "Write metrics.jsonl every N steps."),
    "device": ("Run", "auto, cpu or cuda."),
    "precision": ("Run", ("auto: bf16 on GPUs; on a CPU, measures fp32 and bf16 on this model and batch for a few "
                  "steps and takes the faster.")),
    "compile": ("Run", "torch.compile the model."),
    "checkpoint_activations": ("Run", ("Recompute each block's activations in the backward pass: much less memory "
                               "for long sequences, about a third more compute.")),
}


def _train_option(name: str, *flags: str):
    """The typer option of TrainConfig field `name`, its help from TRAIN_OPTIONS and its default
    from TrainConfig (None as the option's own default: only what is typed is passed on)."""
    panel, text, *shown = TRAIN_OPTIONS[name]
    if not shown:
        value = getattr(TrainConfig(), name)
        if isinstance(value, bool):  # as typer shows a flag's default
            value = name.replace("_", "-") if value else "no-" + name.replace("_", "-")
        shown = [f"{value:g}" if isinstance(value, float) else value]
    return typer.Option(None, *flags, rich_help_panel=panel,
                        help=text + (f" \\[default: {shown[0]}]" if shown[0] is not None else ""))


@app.command()
def train(
    data: Path | None = typer.Argument(None, help="Folder of MIDI files, or a cache from `spemusic data prepare`."),
    preset: Preset | None = _train_option("preset"),
    pe: PE | None = _train_option("pe", "--pe"),
    gated: bool | None = _train_option("gated", "--gated/--no-gated"),
    attention: Attention | None = _train_option("attention"),
    seq_len: int | None = _train_option("seq_len"),
    batch_size: int | None = _train_option("batch_size"),
    grad_accum: int | None = _train_option("grad_accum"),
    steps: int | None = _train_option("steps"),
    epochs: float | None = _train_option("epochs"),
    lr: float | None = _train_option("lr"),
    warmup: int | None = _train_option("warmup"),
    weight_decay: float | None = _train_option("weight_decay"),
    feature_redraw: int | None = _train_option("feature_redraw"),
    val_every: int | None = _train_option("val_every"),
    save_every: int | None = _train_option("save_every"),
    log_every: int | None = _train_option("log_every"),
    device: str | None = _train_option("device"),
    precision: Precision | None = _train_option("precision"),
    compile: bool | None = _train_option("compile", "--compile/--no-compile"),
    checkpoint_activations: bool | None = _train_option(
        "checkpoint_activations", "--checkpoint-activations/--no-checkpoint-activations"),
    dropout: float | None = _train_option("dropout", "--dropout"),
    short_conv: int | None = _train_option("short_conv", "--short-conv"),
    pitch_memory: bool | None = _train_option("pitch_memory", "--pitch-memory/--no-pitch-memory"),
    interval_head: bool | None = _train_option("interval_head", "--interval-head/--no-interval-head"),
    bar_echo: bool | None = _train_option("bar_echo", "--bar-echo/--no-bar-echo"),
    echo_bars: int | None = _train_option("echo_bars", "--echo-bars"),
    echo_head: bool | None = _train_option("echo_head", "--echo-head/--no-echo-head"),
    melody_head: bool | None = _train_option("melody_head", "--melody-head/--no-melody-head"),
    bar_clock: bool | None = _train_option("bar_clock", "--bar-clock/--no-bar-clock"),
    key_head: bool | None = _train_option("key_head", "--key-head/--no-key-head"),
    recall_lr_scale: float | None = _train_option("recall_lr_scale", "--recall-lr-scale"),
    seed: int | None = _train_option("seed"),
    max_len: int | None = _train_option("max_len", "--max-len"),
    init_from: str | None = _train_option("init_from", "--init-from"),
    beats: Path | None = _train_option("beats", "--beats"),
    chords: Path | None = _train_option("chords", "--chords"),
    parts: bool | None = _train_option("parts", "--parts/--no-parts"),
    melody_first: bool | None = _train_option("melody_first", "--melody-first/--no-melody-first"),
    chord_every_bar: bool | None = _train_option("chord_every_bar", "--chord-every-bar/--no-chord-every-bar"),
    drum_grid: bool | None = _train_option("drum_grid", "--drum-grid/--no-drum-grid"),
    repeats: bool | None = _train_option("repeats", "--repeats/--no-repeats"),
    copies: bool | None = _train_option("copies", "--copies/--no-copies"),
    lead_sheet: float | None = _train_option("lead_sheet", "--lead-sheet"),
    piece_starts: float | None = _train_option("piece_starts", "--piece-starts"),
    kit_swaps: float | None = _train_option("kit_swaps", "--kit-swaps"),
    scheduled_sampling: float | None = _train_option("scheduled_sampling", "--scheduled-sampling"),
    output: Path | None = typer.Option(None, "-o", "--output", rich_help_panel="Run",
                                          help="Run folder: checkpoints, metrics.jsonl."),
    config: Path | None = typer.Option(None, "--config", rich_help_panel="Run",
                                          help="TOML file of training options (CLI options override it)."),
    resume: Path | None = typer.Option(None, "--resume", rich_help_panel="Run",
                                          help="Continue the run in this folder where it stopped."),
    threads: int | None = typer.Option(None, "--threads", rich_help_panel="Run", help=THREADS_HELP + "all cores]"),
    stop_after: int | None = typer.Option(None, "--stop-after", rich_help_panel="Run",
                                             help="Stop after this many steps of this invocation (the schedule still "
                                                  "follows --steps; resume later)."),
):
    """Train a Performer with SPE on MIDI files (CPU, GPU, or many GPUs with torchrun).

    Examples:

    spemusic train ../shared/data/pop909 -o runs/pop --preset small --steps 2000

    spemusic train --resume runs/pop

    spemusic train my_drums/ -o runs/mine --init-from groove --steps 500 --lr 3e-4

    torchrun --nproc_per_node 4 -m spemusic train my_midis/ -o runs/big --preset paper --steps 100000
    """
    # the TrainConfig options typed (read before any other name is bound here)
    given = {k: (str(v) if isinstance(v, Path) else v.value if isinstance(v, Enum) else v)
             for k, v in locals().items() if k in TRAIN_OPTIONS and v is not None}
    import_native_libraries()

    _set_threads(threads)
    _check_model_names(init_from, option="--init-from")

    if resume is not None:  # all that was typed goes to the resume rules (train.resolve_run)
        typed = {**given, **{k: v for k, v in (("data", data), ("output", output), ("config", config))
                             if v is not None}}
        _run_training(typed, resume, resume=True, stop_after=stop_after)
        return
    options: dict = {}
    if config is not None:
        options.update(_read_toml(config))
    options.update(given)
    if data is not None:
        options["data"] = str(data)
    if not options.get("data"):
        raise SpemusicError("give DATA (a folder of MIDI files or a data cache), or --resume RUN_DIR")
    if output is None:
        raise SpemusicError("give -o RUN_DIR for checkpoints and metrics")
    _check_no_model_options(options, given, config)
    cfg = TrainConfig.from_dict(options, source=str(config) if config else "")
    _run_training(cfg, output, stop_after=stop_after)


def _check_no_model_options(options: dict, given: dict, config: Path | None) -> None:
    """A fine-tune takes its model from --init-from: options that would choose another are refused."""
    if options.get("init_from"):
        clash = [f"--{k.replace('_', '-')}" if k in given else f"{k} (in {config})"
                 for k in ("preset", "pe", "gated", "attention", "max_len") if k in options]
        if clash:
            raise SpemusicError(f"--init-from takes the model from {options['init_from']}; drop {', '.join(clash)}")


def _run_training(cfg, run_dir: Path, *, resume: bool = False, stop_after: int | None) -> None:
    """train.train with its progress and summary printed (by the main process under torchrun)."""
    from .training.train import train as run_training

    progress = _progress(TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                         TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                         TimeElapsedColumn(), TimeRemainingColumn())
    printer = _train_printer(progress)
    with progress:
        summary = run_training(cfg, run_dir, resume=resume, stop_after=stop_after, events=printer)
    if printer.task is not None and summary["train_loss"] is not None:  # the main process, after a step
        _say_trained(summary)


def _say_trained(summary: dict) -> None:
    """A run's last line: where it stopped, its losses, where its checkpoints are."""
    stopped = summary["steps"] < summary["total_steps"]
    best, folder = summary["best_valid_loss"], escape(summary["run_dir"])
    line = (("stopped (--stop-after)" if stopped else "done") + f": step {summary['steps']}/{summary['total_steps']}, "
            f"train loss {summary['train_loss']:.4f} (mean of the last {summary['train_loss_steps']} steps)")
    if summary["valid_loss"] is not None:
        line += f", valid loss {summary['valid_loss']:.4f} (best {math.inf if best is None else best:.4f})"
    line += f", {summary['wall_seconds']:.0f} s; checkpoints in {folder}/last" + (" and best" if best is not None else "")
    if stopped:
        line += f"; continue with: spemusic train --resume {folder}"
    err.print(line)


def _train_printer(progress: Progress):
    """train.TrainEvents that print: notes and warnings, the run's opening lines, its progress bar."""
    from .nn.checkpoint import run_checkpoint_used
    from .training.train import TrainEvents

    class TrainPrinter(TrainEvents):
        def __init__(self, progress: Progress):
            self.progress, self.task = progress, None

        def note(self, text: str) -> None:
            err.print(f"[yellow]note:[/] {escape(text)}", highlight=False)

        def start(self, info: dict) -> None:
            cfg, splits = info["config"], info["splits"]
            start = f"fine-tuning {cfg.init_from}" if cfg.init_from else cfg.preset
            which = run_checkpoint_used(cfg.init_from) if cfg.init_from else None
            if which:
                start += f" ({which})"
            if info["step"]:
                start = f"resuming {info['run_dir']} at step {info['step']:,} ({start})"
            gated = " gated" if cfg.gated and cfg.pe in ("sinespe", "convspe") else ""
            dtype = str(info["dtype"]).replace("torch.", "")
            err.print(f"[bold]spemusic train[/]: {escape(start)} ({info['parameters'] / 1e6:.2f}M parameters), "
                      f"pe={cfg.pe}{gated}, attention={cfg.attention}, seq-len {cfg.seq_len}, "
                      f"{info['tokens_per_step']} tokens/step, {cfg.steps} steps, {info['device'].type} {dtype} "
                      f"({info['dtype_reason']}), {info['processes']} process(es)")
            err.print(f"data: {escape(str(info['data']))} — train {splits['train']['files']} files / "
                      f"{splits['train']['tokens']:,} tokens, valid {splits['valid']['files']} files")
            for warning in info["warnings"]:
                err.print(f"[yellow]warning:[/] {escape(warning.spelled(_flag))}", highlight=False)
            if info["uncompiled"]:
                err.print(f"note: the step's compiled regions run uncompiled: {info['uncompiled']}", highlight=False)
            self.task = self.progress.add_task("train", total=cfg.steps, completed=info["step"], loss="-", tps="-")

        def step(self, step: int, loss: float) -> None:
            self.progress.update(self.task, completed=step, loss=f"{loss:.3f}")

        def log(self, record: dict, tokens_per_s: float) -> None:
            self.progress.update(self.task, tps=f"{tokens_per_s:,.0f}")

    return TrainPrinter(progress)


def _read_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from .files import check_input_file

    check_input_file(path, missing="no such config file")  # a named pipe would block the read forever
    try:
        options = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpemusicError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise SpemusicError(f"{path}: is a folder, not a TOML config file") from None
    except UnicodeDecodeError:
        raise SpemusicError(f"{path}: not a TOML config file (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as e:
        raise SpemusicError(f"{path}: invalid TOML ({e})") from None
    tables = [k for k, v in options.items() if isinstance(v, dict)]
    if tables:
        raise SpemusicError(f"{path}: [{tables[0]}]: write the options as top-level keys (seq-len = 1024), not in a table")
    return {k.replace("-", "_"): v for k, v in options.items()}


# ----------------------------------------------------------------------------- generate / continue

def _check_model_names(*names: str | None, option: str = "--model") -> None:
    """Model names as given: an empty one is refused (it silently meant pop-piano), and a
    $SPEMUSIC_CHECKPOINTS that holds no model (missing, a file, /proc) is said, not ignored."""
    import os

    from .nn.checkpoint import checkpoints_env_problem

    for name in names:
        if name is not None and not name.strip():
            raise SpemusicError(f"{option} {name!r}: give a model name (spemusic models lists them) or a checkpoint path")
    problem = checkpoints_env_problem()
    if problem:
        err.print(f"[yellow]warning:[/] SPEMUSIC_CHECKPOINTS={escape(os.environ['SPEMUSIC_CHECKPOINTS'])}: {problem}; "
                  "only the shipped models are found", highlight=False)


def _say_which_checkpoint(name_or_path) -> None:
    """A training run stands for its `best` checkpoint (else `last`): say which one is used."""
    from .nn.checkpoint import run_checkpoint_used

    which = run_checkpoint_used(name_or_path) if name_or_path else None
    if which:
        err.print(f"model: {escape(which)}", highlight=False)


def _announce_compiling() -> None:
    """Say so when the generation step is compiled for this machine (once: the result is kept),
    and in one line when compiling fails (the step then runs uncompiled)."""
    from .nn import step_graph

    def note():
        err.print("note: compiling the generation step for this machine, once (under a minute; kept in "
                  f"{escape(str(step_graph.cache_dir()))})", highlight=False)

    step_graph.on_compile = note
    step_graph.on_failure = lambda message: err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def _sampling_progress(total: int | None, disable: bool) -> Progress:
    return _progress(TextColumn("[bold]sampling"), BarColumn(), TextColumn("{task.completed} tokens"),
                     TextColumn("{task.fields[bars]} bars"), TextColumn("{task.fields[tps]} tok/s"),
                     TimeElapsedColumn(), TimeRemainingColumn(), disable=disable)


def _sampling_with_progress(run, *, total, num, tok, prompt, quiet):
    """run(on_token=…, should_stop=…) (pieces.generate or continue_prompt) under a progress bar,
    Ctrl-C stopping it after the current token."""
    with _sampling_progress(total, quiet) as progress:
        task, t0 = None, 0.0

        def on_token(n, bars_done):
            nonlocal task, t0
            if task is None:  # drawn from the first token: the model is loaded and the prompt primed
                task, t0 = progress.add_task("sampling", total=total, bars=0, tps="-"), time.perf_counter()
            if n % 16 == 0 or n == total:
                progress.update(task, completed=n, bars=bars_done,
                                tps=f"{n * num / max(time.perf_counter() - t0, 1e-9):,.0f}")

        # Ctrl-C stops sampling after the current token and what is valid so far is written. A
        # flag, not KeyboardInterrupt: an exception raised at an arbitrary point (inside the
        # progress bar's lock, say) can leave the program hanging on exit. A second Ctrl-C
        # interrupts at once.
        stop = threading.Event()

        def on_sigint(signum, frame):
            stop.set()
            signal.signal(signal.SIGINT, previous)

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            pieces = run(on_token=on_token, should_stop=stop.is_set)
        finally:
            signal.signal(signal.SIGINT, previous)
        if task is not None:  # ends on the bars the files hold (the bar in progress was dropped or completed)
            import numpy as np

            prompt_bars = 0 if prompt is None else int(np.count_nonzero(np.asarray(prompt) == tok.bar_id))
            kept = max(int(np.count_nonzero(ids == tok.bar_id)) for ids in pieces.ids) - prompt_bars
            progress.update(task, completed=pieces.result.new_tokens, total=total or pieces.result.new_tokens,
                            bars=kept)
        return pieces


def _instruments(tok, program_ids) -> str:
    """'Electric Bass (finger), Lead 1 (square) and drums' for Program token ids."""
    names = [tok.instrument_name(int(i)) for i in program_ids]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _report(rows, result, seed, as_json, midis, prompt_bar_count: int, only_continuation: bool, by_length: bool,
            extras=None):
    """One line (or JSON object) per file written. rows: (path, new tokens kept, new bars). by_length:
    every piece sampled result.new_tokens tokens (--length), of which the unfinished last bar is dropped."""
    from .generation.prompts import midi_stats

    tps = result.new_tokens * len(rows) / max(result.wall_seconds, 1e-9)
    for (path, new_tokens, new_bars), midi, written in zip(rows, midis, extras or [{}] * len(rows)):
        notes, seconds = midi_stats(midi)
        file_bars = new_bars if only_continuation else prompt_bar_count + new_bars
        record = {"file": str(path), "tokens": int(new_tokens), "bars": file_bars, "new_bars": new_bars,
                  "notes": notes, "music_seconds": round(seconds, 3), "wall_seconds": round(result.wall_seconds, 3),
                  "tokens_per_s": round(tps, 1), "seed": seed, **written}
        if as_json:
            print(json.dumps(record), flush=True)
        else:
            bars = count(file_bars, "bar") + (
                f" ({prompt_bar_count} of the prompt, {new_bars} new)" if file_bars != new_bars else "")
            dropped = result.new_tokens - new_tokens if by_length else 0
            err.print(f"wrote {path}: {bars}, {count(notes, 'note')}, {seconds:.1f} s of music, seed {seed} "
                      f"({count(new_tokens, 'new token')} at {tps:,.0f} tok/s"
                      + (f"; {count(dropped, 'token')} of an unfinished last bar dropped" if dropped > 0 else "")
                      + ")" + "".join(f"; {name} {escape(p)}" for name, p in written.items()), highlight=False)
        if new_bars == 0 or notes == 0:
            err.print(f"[yellow]warning:[/] {escape(str(path))}: no new notes: {count(result.new_tokens, 'token')} did not "
                      "complete a bar with notes; give a larger --length, or --bars", highlight=False)


@app.command()
def generate(
    model: str = typer.Option("pop-piano", "--model", "-m", help=f"Shipped model name or checkpoint path{AS_FOLDER}."),
    length: int | None = typer.Option(None, "--length", "-n", help="Tokens to sample."),
    bars: int | None = typer.Option(None, "--bars", help="Bars to sample (instead of --length)."),
    num: int = typer.Option(1, "--num", help="Pieces, sampled together in one batch."),
    temperature: float = TEMPERATURE_OPTION,
    top_p: float | None = TOP_P_OPTION,
    bar_top_p: float | None = BAR_TOP_P_OPTION,
    onset_top_p: float | None = ONSET_TOP_P_OPTION,
    repeat: float | None = REPEAT_OPTION,
    hole_penalty: float | None = HOLE_PENALTY_OPTION,
    stacking: float | None = STACKING_OPTION,
    follow_repeats: float | None = FOLLOW_REPEATS_OPTION,
    top_k: int = TOP_K_OPTION,
    seed: int | None = SEED_OPTION,
    meter: str | None = typer.Option(None, "--meter", help="Time signature of the whole piece, e.g. 3/4 "
                                        "\\[default: the model's most likely, which it may change]"),
    tempo: float | None = typer.Option(None, "--tempo", help="Opening tempo in BPM, written exactly (the model "
                                        "may change it later) \\[default: the model's choice]"),
    key: str | None = typer.Option(None, "--key", help="Transpose each piece to this key ('A minor', 'Am', "
                                      "'F# major'), from the key it is found in (Krumhansl-Kessler)."),
    output: str = typer.Option("generated.mid", "-o", "--output", help="Output .mid (OUT-1.mid … with --num), or a "
                               "folder (an existing one, or a name ending in /) for piece.mid, piece-1.mid …"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    precision: StepPrecision = typer.Option(StepPrecision.auto, help=STEP_PRECISION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per output on stdout."),
    chords: str | None = typer.Option(None, "--chords", help="Chord progression, one chord per bar, repeating: "
                                         "'C G Am F', or a file with one chord per line."),
    chord_strength: float = typer.Option(CHORD_STRENGTH, "--chord-strength", help="With --chords: nats added to the "
                                         "bar's chord tones wherever a pitch is sampled (0: the chord tokens alone)."),
    keep_overlaps: bool = typer.Option(False, "--keep-overlaps", help="Keep notes that overlap an earlier one of "
                                       "the same pitch whole, on extra layer tracks (default: the later note ends "
                                       "the earlier one, as MIDI players do)."),
    png: bool = typer.Option(False, "--png", help="Also draw each piece's piano roll, OUT.png beside OUT.mid."),
    audio: bool = typer.Option(False, "--audio", help="Also render each piece, OUT.wav beside OUT.mid (SoundFont: "
                               "$SPEMUSIC_SOUNDFONT, or as `spemusic render` finds one)."),
    parts: str | None = typer.Option(None, "--parts", help=PARTS_HELP + " \\[default: all the model's parts]"),
    part_programs: str | None = PART_PROGRAMS_OPTION,
    threads: int | None = typer.Option(None, "--threads", help=THREADS_HELP + "1: a recurrent step is too "
                                          "small to share (benchmarks/threads.py)]"),
):
    """Sample new pieces from scratch and write MIDI files.

    Examples:

    spemusic generate --length 4096 -o song.mid

    spemusic generate --bars 16 --num 4 --temperature 0.9 -o sketches/

    spemusic generate --bars 16 --chords "C G Am F" -o pop.mid

    spemusic generate --bars 16 --parts melody,piano -o song.mid
    """
    import_native_libraries()
    from .generation.settings import GenerationConfig, check_length_bars
    from .tokens.chords import parse_chords
    from .tokens.tokenizer import parse_parts

    check_length_bars(length, bars)
    if key is not None:
        from .music.keys import parse_key

        key = parse_key(key)
    config = GenerationConfig(num=num, length=length, bars=bars, seed=seed,
                              chords=parse_chords(chords) if chords is not None else None,
                              chord_strength=chord_strength, meter=meter, tempo=tempo, key=key,
                              parts=parse_parts(parts) if parts is not None else None,
                              overlaps="layers" if keep_overlaps else "trim", weights_dtype=_weights_dtype(precision))
    asked = dict(top_p=top_p, bar_top_p=bar_top_p, onset_top_p=onset_top_p, repeat=repeat,
                 hole_penalty=hole_penalty, stacking=stacking, follow_repeats=follow_repeats)
    _generate_or_continue(model, None, None, config, temperature, top_k, asked, output, overwrite, device, as_json,
                          False, png=png, threads=threads, audio=audio, part_programs=part_programs)


@app.command("continue")
def continue_(
    prompt: Path = typer.Argument(..., help="MIDI file to continue."),
    model: str | None = typer.Option(None, "--model", "-m", help=f"Model name or checkpoint path{AS_FOLDER} "
                                        "\\[default: groove for a drums-only prompt, else pop-piano]."),
    prompt_bars: int | None = typer.Option(None, "--prompt-bars", help="Use only the first N bars of music of the "
                                              "prompt (leading empty bars are not counted)."),
    from_bar: int | None = typer.Option(None, "--from-bar", help="Continue after bar N of the file (numbered as "
                                           "a score editor does, empty bars included); the bars after it are replaced."),
    length: int | None = typer.Option(None, "--length", "-n", help="Tokens to add."),
    bars: int | None = typer.Option(None, "--bars", help="Bars to add (instead of --length)."),
    num: int = typer.Option(1, "--num", help="Continuations, sampled together in one batch."),
    temperature: float = TEMPERATURE_OPTION,
    top_p: float | None = TOP_P_OPTION,
    bar_top_p: float | None = BAR_TOP_P_OPTION,
    onset_top_p: float | None = ONSET_TOP_P_OPTION,
    repeat: float | None = REPEAT_OPTION,
    hole_penalty: float | None = HOLE_PENALTY_OPTION,
    stacking: float | None = STACKING_OPTION,
    follow_repeats: float | None = FOLLOW_REPEATS_OPTION,
    top_k: int = TOP_K_OPTION,
    seed: int | None = SEED_OPTION,
    output: str | None = typer.Option(None, "-o", "--output", help="Output .mid (OUT-1.mid … with --num), or a "
                                         "folder. \\[default: PROMPT-continued.mid in the current folder]"),
    only_continuation: bool = typer.Option(False, "--only-continuation", help="Write only the new bars."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    precision: StepPrecision = typer.Option(StepPrecision.auto, help=STEP_PRECISION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per output on stdout."),
    beats: Path | None = typer.Option(None, "--beats", help="Beat annotation of the prompt (time, beat-in-bar; "
                                         "or POP909's three columns): its bars are the annotated ones."),
    chords: str | None = typer.Option(None, "--chords", help="Chord progression of the new bars, one per bar, "
                                         "repeating: 'C G Am F', or a file."),
    chord_strength: float = typer.Option(CHORD_STRENGTH, "--chord-strength", help="With --chords: nats added to the "
                                         "bar's chord tones wherever a pitch is sampled (0: the chord tokens alone)."),
    keep_overlaps: bool = typer.Option(False, "--keep-overlaps", help="Keep notes that overlap an earlier one of "
                                       "the same pitch whole, on extra layer tracks (default: the later note ends "
                                       "the earlier one, as MIDI players do)."),
    png: bool = typer.Option(False, "--png", help="Also draw each piece's piano roll, OUT.png beside OUT.mid."),
    audio: bool = typer.Option(False, "--audio", help="Also render each piece, OUT.wav beside OUT.mid (SoundFont: "
                               "$SPEMUSIC_SOUNDFONT, or as `spemusic render` finds one)."),
    part_programs: str | None = PART_PROGRAMS_OPTION,
    threads: int | None = typer.Option(None, "--threads", help=THREADS_HELP + "1: a recurrent step is too "
                                          "small to share (benchmarks/threads.py)]"),
):
    """Continue a MIDI file: the prompt is kept note for note, new bars follow.

    Examples:

    spemusic continue data/examples/groove.mid --bars 8 -o more.mid

    spemusic continue song.mid --prompt-bars 4 --length 2048 -o song_more.mid

    spemusic continue song.mid --from-bar 16 --bars 8 -o song_new_ending.mid

    spemusic continue ../shared/data/pop909/001.mid --beats ../shared/data/pop909/beats/001.txt --prompt-bars 8 --bars 8
    """
    import_native_libraries()
    from .generation.settings import GenerationConfig, check_length_bars
    from .tokens.chords import parse_chords

    check_length_bars(length, bars)
    config = GenerationConfig(num=num, length=length, bars=bars, seed=seed,
                              chords=parse_chords(chords) if chords is not None else None,
                              chord_strength=chord_strength, overlaps="layers" if keep_overlaps else "trim",
                              weights_dtype=_weights_dtype(precision))
    asked = dict(top_p=top_p, bar_top_p=bar_top_p, onset_top_p=onset_top_p, repeat=repeat,
                 hole_penalty=hole_penalty, stacking=stacking, follow_repeats=follow_repeats)
    output = output or Path(f"{prompt.with_suffix('').name}-continued.mid")
    _generate_or_continue(model, prompt, prompt_bars, config, temperature, top_k, asked, output, overwrite, device,
                          as_json, only_continuation, beats=beats, from_bar=from_bar, png=png, threads=threads,
                          audio=audio, part_programs=part_programs)


def _check_extra_outputs(paths, png: bool, audio: bool, overwrite: bool):
    """Refuse --png and --audio before any work where they cannot be written (no matplotlib, no
    SoundFont, a file in the way); returns the SoundFont for --audio."""
    from .files import check_output_file

    if png:
        from .music.pianoroll import require_matplotlib

        require_matplotlib()
        for p in paths:
            check_output_file(p.with_suffix(".png"), overwrite, "--png", may_create=True)
    if not audio:
        return None
    from .music.audio import find_soundfont

    soundfont = find_soundfont()
    for p in paths:
        check_output_file(p.with_suffix(".wav"), overwrite, "--audio", may_create=True)
    return soundfont


def _write_pieces(paths, pieces, tok, *, title: str, png: bool, soundfont, overwrite: bool):
    """Each piece's MIDI file, and its picture (png) and audio (a soundfont) beside it: the MIDI
    files, per piece (path, new tokens, new bars), and per piece the extra files written."""
    from .files import write_output
    from .generation.prompts import midi_bytes

    midis, rows, extras = [], [], []
    for path, midi, (new_tokens, new_bars) in zip(paths, pieces.midis, pieces.new_tokens_and_bars(tok)):
        data = midi_bytes(midi)
        write_output(data, path, overwrite)
        written = {}
        if png or soundfont is not None:
            import symusic

            score = symusic.Score.from_midi(data)
        if png:
            from .music.pianoroll import render

            write_output(render(score, ".png", title=f"{path.name} ({title})"), path.with_suffix(".png"), overwrite)
            written["png"] = str(path.with_suffix(".png"))
        if soundfont is not None:
            from .music.audio import SAMPLE_RATE, render, write_audio

            wav = path.with_suffix(".wav")
            write_output(write_audio(render(score, soundfont), wav, SAMPLE_RATE), wav, overwrite)
            written["audio"] = str(wav)
        midis.append(midi)
        extras.append(written)
        rows.append((path, new_tokens, new_bars))
    return midis, rows, extras


def _say_key_moves(paths, moves, key) -> None:
    from .music.keys import key_name

    for path, move in zip(paths, moves):
        found = key_name(move.tonic, move.mode)
        if move.mode != key[1]:
            relative = move.tonic - 3 if move.mode == "major" else move.tonic + 3
            found += f", whose relative is {key_name(relative, key[1])}"
        shift = move.shift
        moves = (f"transposed {'up' if shift > 0 else 'down'} {abs(shift)} semitone{'s' * (abs(shift) != 1)} "
                 f"to {key_name(*key)}" if shift else "kept as it is")
        err.print(f"{path}: found in {found}; {moves}", highlight=False)


def _set_part_programs(tok, text: str | None) -> None:
    """--part-programs onto the tokenizer that decodes the pieces (a model without parts refuses it)."""
    if text is None:
        return
    from .tokens.tokenizer import parse_part_programs

    if not tok.config.parts:
        raise SpemusicError("--part-programs: this model has no parts (melody, bridge, piano)")
    tok.part_programs.update(parse_part_programs(text))


def _before_sampling(config, temperature, top_k, asked, device, output, overwrite, png, audio, threads):
    """What generate, continue and accompany check before any work (the settings in range, the
    device there, the outputs writable), and the threads they sample on: (the config with its
    seed, the output paths, the SoundFont for --audio)."""
    from .generation.prompts import output_paths
    from .nn.device import pick_device

    config = replace(config, seed=_seed_or_new(config.seed))
    config.check()
    _sampling_options({}, temperature, top_k, **asked)
    pick_device(device, auto=False)
    paths = output_paths(output, config.num, overwrite)
    soundfont = _check_extra_outputs(paths, png, audio, overwrite)
    # one recurrent step is a chain of small matrix products: a second thread gains little on an
    # idle machine and loses much on a busy one (benchmarks/results/threads.txt)
    _set_threads(threads, 1 if device == "cpu" else None)
    return config, paths, soundfont


def _generate_or_continue(model_name, prompt_path, prompt_bars, config, temperature, top_k, asked, output, overwrite,
                          device, as_json, only_continuation, beats=None, png=False, threads=None, audio=False,
                          from_bar=None, part_programs=None):
    """generate (no prompt) or continue: one GenerationConfig, one call to pieces."""
    from .generation.pieces import continue_prompt, generate
    from .generation.prompts import load_prompt
    from .nn.checkpoint import load_model
    from .tokens.tokenizer import REMITokenizer

    _check_model_names(model_name)
    config, paths, soundfont = _before_sampling(config, temperature, top_k, asked, device, output, overwrite, png,
                                                audio, threads)
    prompt = None
    if prompt_path is not None:
        # read the prompt with the default tokenizer to pick a model, then with the model's own
        prompt = load_prompt(prompt_path, REMITokenizer(), prompt_bars, beats, from_bar)
        if model_name is None:
            model_name = "groove" if prompt.only_drums else "pop-piano"
    model, tok, info = load_model(model_name or "pop-piano", device=device, return_info=True)
    _set_part_programs(tok, part_programs)
    config = replace(config, options=_sampling_options(info, temperature, top_k, **asked))
    _say_which_checkpoint(model_name)
    _announce_compiling()
    config.check(tok)  # the chords, meter, tempo and parts refused before any work when the model lacks them
    if prompt is not None and tok.config != REMITokenizer().config:
        prompt = load_prompt(prompt_path, tok, prompt_bars, beats, from_bar)
    for warning in prompt.warnings if prompt is not None else []:
        err.print(f"[yellow]warning:[/] {escape(str(prompt_path))}: {escape(warning)}", highlight=False)
    for caveat in prompt.caveats if prompt is not None else []:
        err.print(f"[yellow]note:[/] {escape(str(prompt_path))}: {escape(caveat)}", highlight=False)
    if prompt is None:
        def run(**callbacks):
            return generate(model, tok, config, **callbacks)
    else:
        def run(**callbacks):
            return continue_prompt(model, tok, prompt, config, only_continuation=only_continuation, **callbacks)
    pieces = _sampling_with_progress(run, total=config.length, num=config.num, tok=tok,
                                     prompt=None if prompt is None else prompt.ids,
                                     quiet=as_json and not sys.stderr.isatty())
    result = pieces.result
    if config.key is not None:
        _say_key_moves(paths, pieces.keys, config.key)
    if pieces.stopped_programs and pieces.new_programs:  # they stop at the cut
        err.print(f"[yellow]note:[/] the model did not continue {_instruments(tok, pieces.stopped_programs)} of the "
                  f"prompt; the new bars play {_instruments(tok, pieces.new_programs)}", highlight=False)
    empty = [str(paths[i]) for i in pieces.empty()]
    if empty:  # nothing is written: an empty MIDI file is no piece
        raise SpemusicError(f"{len(empty)} of {count(len(paths), 'piece')} {verb(len(empty), 'holds', 'hold')} no note "
                            f"({count(result.new_tokens, 'token')} did not "
                            f"complete a bar with notes): nothing written; give a larger --length, or --bars")
    midis, rows, extras = _write_pieces(paths, pieces, tok, title=f"{model_name or 'pop-piano'}, seed {config.seed}",
                                        png=png, soundfont=soundfont if audio else None, overwrite=overwrite)
    _report(rows, result, config.seed, as_json, midis, pieces.prompt_bars, only_continuation,
            by_length=config.bars is None, extras=extras)
    if result.interrupted:
        err.print("interrupted: wrote the music generated so far")
        raise typer.Exit(INTERRUPTED_AND_SAID)


def _weights_dtype(precision: StepPrecision):
    """--precision as the step's weight dtype (auto: None, the sampler picks)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}.get(precision.value)


@app.command()
def accompany(
    melody: Path = typer.Argument(..., help="MIDI file of the melody: a one-track file, or a song whose MELODY "
                                  "track (or --track) is the melody."),
    model: str = typer.Option("pop-piano", "--model", "-m",
                              help=f"Model name or checkpoint path of a model with parts{AS_FOLDER}."),
    track: str | None = typer.Option(None, "--track", help="The melody's track, by name or number (1 = the first "
                                     "track with notes) \\[default: the one named MELODY, or the only one]"),
    parts: str = typer.Option("bridge,piano", "--parts", help=PARTS_HELP.replace("play", "write under the melody")),
    part_programs: str | None = PART_PROGRAMS_OPTION,
    num: int = typer.Option(1, "--num", help="Accompaniments, sampled together in one batch."),
    temperature: float = TEMPERATURE_OPTION,
    top_p: float | None = TOP_P_OPTION,
    onset_top_p: float | None = ONSET_TOP_P_OPTION,
    repeat: float | None = REPEAT_OPTION,
    hole_penalty: float | None = HOLE_PENALTY_OPTION,
    stacking: float | None = STACKING_OPTION,
    follow_repeats: float | None = FOLLOW_REPEATS_OPTION,
    top_k: int = TOP_K_OPTION,
    seed: int | None = SEED_OPTION,
    beats: Path | None = typer.Option(None, "--beats", help="Beat annotation of the melody file (time, beat-in-bar; "
                                         "or POP909's three columns): its bars are the annotated ones."),
    chords: str | None = typer.Option(None, "--chords", help="Chord progression, one chord per bar of the melody, "
                                         "repeating: 'C G Am F', or a file with one chord per line. \\[default: a "
                                         "chart drawn from the whole melody by the model's harmonizer]"),
    harmonize: bool = typer.Option(True, "--harmonize/--no-harmonize", help="Without --chords: chart one chord per "
                                   "bar from the whole melody first (the model's harmony.json), then play it; "
                                   "--no-harmonize: the model names each bar's chord as it writes, from the "
                                   "melody's first bar on (the bars before it keep the chart's)."),
    chord_strength: float = typer.Option(CHORD_STRENGTH, "--chord-strength", help="With --chords or a chart: nats "
                                         "added to the bar's chord tones wherever a pitch is sampled (0: the chord "
                                         "tokens alone)."),
    output: str | None = typer.Option(None, "-o", "--output", help="Output .mid (OUT-1.mid … with --num), or a "
                                         "folder. \\[default: MELODY-accompanied.mid in the current folder]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per output on stdout."),
    png: bool = typer.Option(False, "--png", help="Also draw each piece's piano roll, OUT.png beside OUT.mid."),
    audio: bool = typer.Option(False, "--audio", help="Also render each piece, OUT.wav beside OUT.mid."),
    threads: int | None = typer.Option(None, "--threads", help=THREADS_HELP + "1]"),
):
    """Accompany a melody: the melody is kept note for note, the model writes the bridge and the
    piano under it, bar by bar, as long as the melody.

    Examples:

    spemusic accompany melody.mid -o song.mid

    spemusic accompany melody.mid --chords "Am F C G" --num 4 -o takes/

    spemusic accompany ../shared/data/pop909/001.mid --beats ../shared/data/pop909/beats/001.txt -o 001-new.mid
    """
    import_native_libraries()
    from .generation.accompany import load_melody
    from .generation.pieces import accompany as accompany_melody
    from .generation.settings import GenerationConfig
    from .nn.checkpoint import load_model
    from .tokens.chords import parse_chords
    from .tokens.tokenizer import parse_parts

    _check_model_names(model)
    wanted = parse_parts(parts)
    if "melody" in wanted:
        raise SpemusicError("--parts: the melody is the file's; name the parts to write under it (bridge, piano)")
    config = GenerationConfig(num=num, seed=seed, chords=parse_chords(chords) if chords is not None else None,
                              chord_strength=chord_strength, parts=wanted)
    asked = dict(top_p=top_p, onset_top_p=onset_top_p, repeat=repeat, hole_penalty=hole_penalty, stacking=stacking,
                 follow_repeats=follow_repeats)
    config, paths, soundfont = _before_sampling(config, temperature, top_k, asked, device,
                                                output or Path(f"{melody.with_suffix('').name}-accompanied.mid"),
                                                overwrite, png, audio, threads)
    net, tok, info = load_model(model, device=device, return_info=True)
    _set_part_programs(tok, part_programs)
    _say_which_checkpoint(model)
    _announce_compiling()
    held = load_melody(melody, tok, track, beats)
    config = replace(config, options=_sampling_options(info, temperature, top_k, **asked))
    config.check(tok)

    def run(**callbacks):
        return accompany_melody(net, tok, held, config, harmonize=harmonize, **callbacks)

    pieces = _sampling_with_progress(run, total=None, num=num, tok=tok, prompt=None,
                                     quiet=as_json and not sys.stderr.isatty())
    if config.chords is None and pieces.chart is not None:
        charted = [c for c in pieces.chart if c is not None]
        if len(charted) == len(pieces.chart):
            err.print(f"chords (charted from the melody, one per bar): {' '.join(charted)}")
        elif charted:
            err.print(f"chords charted for the {count(len(charted), 'bar')} before the melody: {' '.join(charted)}; "
                      f"the model names the rest")
    midis, rows, extras = _write_pieces(paths, pieces, tok, title=f"{model}, seed {config.seed}", png=png,
                                        soundfont=soundfont if audio else None, overwrite=overwrite)
    _report(rows, pieces.result, config.seed, as_json, midis, 0, False, by_length=False, extras=extras)
    if pieces.result.interrupted:
        err.print("interrupted: wrote the music generated so far")
        raise typer.Exit(INTERRUPTED_AND_SAID)


# ----------------------------------------------------------------------------- play

def _seed_or_new(seed: int | None) -> int:
    """--seed checked, or a new one (a new piece on every run; the seed is printed, so a piece can
    be made again)."""
    if seed is None:
        import secrets

        return secrets.randbelow(2**31)
    if not 0 <= seed < 2**63:
        raise SpemusicError(f"--seed must be between 0 and 2^63 - 1 (got {seed})")
    return seed


def _play_outputs(port: str | None, to_stdout: bool, midi_to_stdout: bool, soundfont: Path | None):
    """play's outputs: (MIDI out or None, audio out or None, the SoundFont or None, their description)."""
    from .generation.play import SoundCard, open_midi_port, require_mido, stdout_audio, stdout_midi
    from .music.audio import find_soundfont

    if midi_to_stdout:
        require_mido()
    midi_out = open_midi_port(port) if port is not None else (stdout_midi if midi_to_stdout else None)
    audio_out, font = None, None
    if to_stdout or (port is None and not midi_to_stdout):
        font = find_soundfont(soundfont)
        audio_out = stdout_audio if to_stdout else SoundCard(44100)
    outputs = ", ".join(x for x in (port and f"MIDI port {port}", midi_to_stdout and "MIDI on stdout",
                                    to_stdout and f"audio on stdout ({font.name})",
                                    audio_out is not None and not to_stdout and f"the sound card ({font.name})") if x)
    return midi_out, audio_out, font, outputs


def _say_what_played(result, seed: int) -> None:
    minutes, secs = divmod(result.music_seconds, 60)
    if result.reader_closed:
        err.print("stdout closed by its reader: the music stopped there", highlight=False)
    err.print(f"played {count(result.bars, 'bar')}, {int(minutes)}:{secs:04.1f} of music, seed {seed}; "
              f"sampling margin {result.margin:.1f}x real time ({result.sampled_seconds:.1f} s of music sampled in "
              f"{result.sampling_seconds:.1f} s)" + (f"; the music waited for the sampler {result.underruns} times, "
                                                    f"{result.late_seconds:.1f} s in all" if result.underruns else ""),
              highlight=False)


@app.command()
def play(
    model: str | None = typer.Option(None, "--model", "-m", help=f"Model name or checkpoint path{AS_FOLDER} "
                                        "\\[default: groove for a drums-only prompt, else pop-piano]."),
    prompt: Path | None = typer.Option(None, "--prompt", help="MIDI file to continue (it is not played)."),
    bars: int | None = typer.Option(None, "--bars", help="Bars to play \\[default: no end; Ctrl-C stops at the "
                                       "end of a bar]"),
    temperature: float = TEMPERATURE_OPTION,
    top_p: float | None = TOP_P_OPTION,
    bar_top_p: float | None = BAR_TOP_P_OPTION,
    onset_top_p: float | None = ONSET_TOP_P_OPTION,
    repeat: float | None = REPEAT_OPTION,
    hole_penalty: float | None = HOLE_PENALTY_OPTION,
    stacking: float | None = STACKING_OPTION,
    follow_repeats: float | None = FOLLOW_REPEATS_OPTION,
    seed: int | None = typer.Option(None, help="Random seed \\[default: a new one, printed]"),
    port: str | None = typer.Option(None, "--port", help="Send MIDI to this output port (mido with python-rtmidi)."),
    to_stdout: bool = typer.Option(False, "--stdout", help="Write raw audio to stdout: 16-bit stereo at 44.1 kHz, "
                                   "for `| aplay -f cd`."),
    midi_to_stdout: bool = typer.Option(False, "--stdout-midi", help="Write raw MIDI messages to stdout, each when due."),
    record: Path | None = typer.Option(None, "--record", help="Also keep what was played in this .mid file."),
    soundfont: Path | None = typer.Option(None, "--soundfont", help="SoundFont for audio (as `render` finds one)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --record file."),
    threads: int | None = typer.Option(None, "--threads", help=THREADS_HELP + "1]"),
):
    """Play without end, live: bars sampled on the recurrent path, sent out paced to real time.

    Without --port or --stdout it plays on the sound card (sounddevice). The margin printed is
    the seconds of music sampled per second of sampling: above 1, sampling keeps ahead.

    Examples:

    spemusic play --bars 32

    spemusic play --stdout | aplay -f cd

    spemusic play --model groove --port "FLUID Synth" --record jam.mid

    spemusic play --prompt song.mid --seed 7 --stdout > live.raw
    """
    import_native_libraries()
    from .files import check_output_file, write_output
    from .generation.play import Player
    from .generation.prompts import load_prompt, midi_bytes
    from .nn.checkpoint import load_model
    from .tokens.tokenizer import REMITokenizer

    if bars is not None and bars < 1:
        raise SpemusicError(f"--bars must be at least 1 (got {bars})")
    seed = _seed_or_new(seed)
    if to_stdout and midi_to_stdout:
        raise SpemusicError("--stdout and --stdout-midi both write to stdout: give one")
    if (to_stdout or midi_to_stdout) and sys.stdout.isatty():
        raise SpemusicError("stdout is a terminal: pipe it (| aplay -f cd) or redirect it (> live.raw)")
    asked = dict(top_p=top_p, bar_top_p=bar_top_p, onset_top_p=onset_top_p, repeat=repeat,
                 hole_penalty=hole_penalty, stacking=stacking, follow_repeats=follow_repeats)
    _sampling_options({}, temperature, 0, **asked)  # refused before any work when out of range
    if record is not None:
        if record.suffix.lower() not in (".mid", ".midi"):
            raise SpemusicError(f"--record {record}: give a .mid file")
        check_output_file(record, overwrite, "--record")
    _check_model_names(model)
    _set_threads(threads, 1)  # one recurrent step is too small to share between threads
    midi_out, audio_out, font, outputs = _play_outputs(port, to_stdout, midi_to_stdout, soundfont)
    prompt_ids = None
    if prompt is not None:
        loaded = load_prompt(prompt, REMITokenizer())
        model = model or ("groove" if loaded.only_drums else "pop-piano")
    net, tok, info = load_model(model or "pop-piano", return_info=True)
    options = _sampling_options(info, temperature, 0, **asked)
    _say_which_checkpoint(model)
    _announce_compiling()
    if prompt is not None:  # read again only when the model's tokenizer differs from the default
        prompt_ids = (loaded if tok.config == REMITokenizer().config else load_prompt(prompt, tok)).ids
    player = Player(midi_out=midi_out, audio_out=audio_out, soundfont=font)
    err.print(f"playing {model or 'pop-piano'}, seed {seed}, to {outputs}; Ctrl-C stops at the end of a bar",
              highlight=False)
    result = _play_until_stopped(net, tok, player, audio_out, prompt=prompt_ids, options=options, seed=seed,
                                 bars=bars, record=record is not None)
    _say_what_played(result, seed)
    if record is not None and result.tokens:
        write_output(midi_bytes(tok.decode([tok.bos_id, *result.tokens, tok.eos_id])), record, overwrite)
        err.print(f"recorded {record}", highlight=False)


def _play_until_stopped(net, tok, player, audio_out, *, prompt, options, seed: int, bars: int | None, record: bool):
    """play.play with a status line; the first Ctrl-C ends the music at the end of its bar."""
    from .generation.play import SoundCard, play as play_bars
    from .generation.settings import GenerationConfig

    stop = threading.Event()

    def on_sigint(signum, frame):  # the first Ctrl-C ends the music at the end of its bar; a second, at once
        stop.set()
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, on_sigint)
    with _progress(TextColumn("[bold]playing"), TextColumn("{task.fields[status]}"), TimeElapsedColumn()) as progress:
        task = progress.add_task("playing", status="sampling the first bar")

        def on_bar(r):
            progress.update(task, status=f"bar {len(player.bar_ends)}, {r.sampled_seconds:.0f} s sampled, margin "
                                         f"{r.margin:.1f}x")

        pipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a reader that leaves (| head) stops the music
        try:
            return play_bars(net, tok, player, GenerationConfig(seed=seed, bars=bars, options=options), prompt=prompt,
                             should_stop=stop.is_set, record=record, on_bar=on_bar)
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGPIPE, pipe)
            if isinstance(audio_out, SoundCard):
                audio_out.close()


# ----------------------------------------------------------------------------- models

@app.command()
def models():
    """List the shipped models (and those in $SPEMUSIC_CHECKPOINTS).

    Example:

    spemusic models
    """
    import_native_libraries()
    from .nn.checkpoint import available_models, read_metadata, validated_configs

    _check_model_names()
    found = available_models()
    if not found:
        err.print("no models installed")
        raise typer.Exit(1)
    for name, folder in found.items():
        weights = folder / "model.safetensors"
        try:
            meta = read_metadata(weights)
            m, _ = validated_configs(weights, meta)
        except SpemusicError as e:  # listed, so that the user sees why it cannot be used
            print(f"{name:<12} unusable: {str(e).removeprefix(f'{weights}: ')}")
            continue
        info = meta["info"]
        pe = m.pe + (" gated" if m.gated and m.uses_spe else "")
        print(f"{name:<12} {pe:<15} {info.get('parameters', 0) / 1e6:.1f}M parameters   "
              f"trained on {info.get('seq_len', '?')}-token windows   {info.get('data_name', info.get('data', '?'))}")


@app.command("eval")
def eval_(
    args: list[str] = typer.Argument(..., help="MODEL \\[MODEL …] DATA: models (names or checkpoints) then a MIDI "
                                     "folder or data cache; with --metrics: MIDI files or folders."),
    split: str = typer.Option("valid", help="train, valid, test, or all (a plain folder of MIDI files)."),
    max_len: int = typer.Option(2048, "--max-len", help="Score positions 0 … N of each piece."),
    bucket: int = typer.Option(128, help="Positions per bucket in the table, JSON and plot."),
    max_pieces: int = typer.Option(0, "--max-pieces", min=0, help="Score only the first N pieces (0: all)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a plot of NLL against position (.png, .svg or .pdf)."),
    metrics: bool = typer.Option(False, "--metrics", help="Music metrics of MIDI files instead of model NLL."),
    reference: Path | None = typer.Option(None, "--reference", help="With --metrics: real MIDI to compare with."),
    seed: int = typer.Option(0, help="SPE draw used for scoring."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    beats: Path | None = typer.Option(None, "--beats", help="Folder of beat annotations for a MIDI folder "
                                         "(as for `data prepare`)."),
    chords: Path | None = typer.Option(None, "--chords", help="Folder of chord annotations for a MIDI folder."),
    repeat: float = typer.Option(0.0, "--repeat", help="Score each model mixed with a continuous cache of the "
                                 "piece's own hidden states of this share, as `generate --repeat` samples (0: the "
                                 "model alone)."),
    threads: int | None = typer.Option(None, "--threads", help=THREADS_HELP + "all cores]"),
):
    """Score models by position (NLL per token, up to and past the trained length), or measure music.

    Examples:

    spemusic eval pop-piano ../shared/data/pop909 --max-len 4096 --plot nll.png --json nll.json

    spemusic eval runs/ape runs/spe ../shared/data/pop909 --max-len 4096 --plot compare.png

    spemusic eval --metrics generated/ --reference ../shared/data/pop909
    """
    import_native_libraries()
    from .files import check_output_file

    if json_path is not None:
        check_output_file(json_path, option="--json")
    if metrics:
        if plot is not None:
            raise SpemusicError("--plot draws NLL by position; it does not apply to --metrics")
        _eval_metrics(args, reference, json_path)
        return
    if reference is not None:
        raise SpemusicError("--reference compares music metrics; use it with --metrics")
    _set_threads(threads)
    from .nn.checkpoint import load_model
    from .training.evaluate import evaluate_nll, plot_format

    if plot is not None:
        plot_format(plot)
        check_output_file(plot, option="--plot")

    if len(args) < 2:
        raise SpemusicError("give MODEL [MODEL …] DATA")
    from .generation.sampling import SamplingOptions

    repeat_options = SamplingOptions(repeat=repeat)
    repeat_options.check()
    if split not in ("train", "valid", "test", "all"):
        raise SpemusicError(f"--split must be train, valid, test or all (got {split!r})")
    *model_names, data = args
    _check_model_names(*model_names, option="MODEL")
    reports = []
    for name in model_names:
        model, tok, info = load_model(name, device=device, return_info=True)
        _say_which_checkpoint(name)
        with _progress(TextColumn(f"[bold]{escape(name)}"), BarColumn(), MofNCompleteColumn(), TextColumn("pieces"),
                       TimeElapsedColumn()) as progress:
            reports.append(evaluate_nll(model, tok, Path(data), split, max_len, bucket, name=name,
                                        trained_len=info.get("seq_len"), device=device,
                                        max_pieces=max_pieces or None, progress=progress, beats_dir=beats,
                                        chords_dir=chords, cache=repeat_options.cache()))
    _print_nll_table(reports, f"{split} split of {data}" + (f", with the continuous cache at --repeat {repeat}"
                                                             if repeat else ""))
    _write_nll_outputs(reports, json_path, plot)


def _print_nll_table(reports, what: str) -> None:
    """eval's table: NLL per token by position bucket, one column per model; `what`: the data scored."""
    table = Table(title=f"NLL per token by position ({what})")
    table.add_column("positions")
    for r in reports:
        table.add_column(r.model, justify="right")
    for i, b in enumerate(reports[0].buckets):
        marks = [r.model for r in reports if r.trained_len and b["start"] < r.trained_len <= b["end"]]
        label = f"{b['start']}-{b['end']}"
        if marks:
            label += " ← trained length" + (f" of {', '.join(marks)}" if len(reports) > 1 else "")
        table.add_row(escape(label), *[f"{r.buckets[i]['nll']:.4f}" if r.buckets[i]["nll"] is not None else "-"
                                       for r in reports])
    table.add_row("[bold]mean", *[f"[bold]{r.mean_nll:.4f}" for r in reports])
    # per note and per bar: comparable between models whose tokenizers differ
    table.add_row("nats per note", *[f"{r.nats_per_note:.4f}" if r.nats_per_note else "-" for r in reports])
    table.add_row("nats per bar", *[f"{r.nats_per_bar:.2f}" if r.nats_per_bar else "-" for r in reports])
    # by part: each part's notes (their Program … Duration tokens) per note of that part, the shared
    # tokens (bars, positions, chords, tempo) per note of the piece
    names = list(dict.fromkeys(n for r in reports for n in r.parts))
    if len([n for n in names if n != "shared"]) > 1:  # one part alone is the piece's row above
        for n in names:
            label = "  shared tokens, per note" if n == "shared" else f"  {n}, per {n} note"
            table.add_row(escape(label), *[f"{r.part_nats_per_note()[n]:.4f}" if n in r.parts else "-" for r in reports])
    out.print(table)
    if any(b["nll"] is None for r in reports for b in r.buckets):
        out.print("-: no piece of the data reaches these positions")


def _write_nll_outputs(reports, json_path: Path | None, plot: Path | None) -> None:
    """eval's --json and --plot files."""
    from .files import write_atomically
    from .training.evaluate import plot_reports

    if json_path is not None:
        payload = reports[0].to_dict() if len(reports) == 1 else {"models": [r.to_dict() for r in reports]}
        write_atomically(json.dumps(payload, indent=2).encode(), json_path)
        err.print(f"wrote {json_path}")
    if plot is not None:
        plot_reports(reports, plot)
        err.print(f"wrote {plot}")


def _eval_metrics(args: list[str], reference: Path | None, json_path: Path | None) -> None:
    from .music.metrics import collection_summary
    from .tokens.tokenizer import REMITokenizer, TokenizerConfig

    tok = REMITokenizer(TokenizerConfig(chords=True))  # chord markers count as chords
    pairs, _ = _expand_inputs([Path(a) for a in args], {".mid", ".midi"})
    columns = {"generated": collection_summary([p for p, _ in pairs], tok)}
    if reference is not None:
        ref_pairs, _ = _expand_inputs([reference], {".mid", ".midi"})
        columns["reference"] = collection_summary([p for p, _ in ref_pairs], tok)
    sources = {"generated": ", ".join(map(str, args)), "reference": str(reference)}
    for name, (means, skipped) in columns.items():
        if not means:  # named by the user's own paths
            raise SpemusicError(f"{sources[name]}: no readable MIDI file ({len(skipped)} skipped; first: {skipped[0]})"
                                if skipped else f"{sources[name]}: no MIDI file")
        for reason in skipped:
            err.print(f"[yellow]skipped:[/] {escape(reason)}", highlight=False)
    table = Table(title="music metrics (means over files)")
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    if len(columns) == 2:
        table.add_column("generated / reference", justify="right")
    import math

    def number(v):  # NaN (a metric no file has, e.g. pitch entropy of drums only) -> None: valid JSON
        return None if isinstance(v, float) and math.isnan(v) else v

    undefined = False
    for key in ("files", "H1", "H4", "GS", "notes_per_bar", "polyphony", "pitch_range"):
        vals = [number(columns[n][0][key]) for n in columns]
        undefined |= None in vals
        row = ["-" if v is None else f"{v:.0f}" if key == "files" else f"{v:.3f}" for v in vals]
        if len(vals) == 2:
            row.append(f"{vals[0] / vals[1]:.2f}" if None not in vals and vals[1] and key != "files" else "")
        table.add_row(key, *row)
    out.print(table)
    if undefined:
        out.print("-: no file has it (H1, H4 and pitch range count pitched notes only, not drums)")
    if json_path is not None:
        from .files import write_atomically

        payload = {n: {k: number(v) for k, v in c[0].items()} for n, c in columns.items()}
        write_atomically(json.dumps(payload, indent=2, allow_nan=False).encode(), json_path)
        err.print(f"wrote {json_path}")


def _exit_interrupted() -> None:
    """Exit 130 now: a Ctrl-C still pending would otherwise end the interpreter's shutdown by
    the signal itself (exit status -2) after the one-line message."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _exit(code: int) -> None:
    """Exit with `code`, its message (if any) printed: Ctrl-C is ignored from here, or one landing
    in the interpreter's teardown (long with torch loaded) would make the exit status the signal's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def main() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    # a closed stdout (e.g. `| head`) must not print a traceback either
    signal.signal(signal.SIGPIPE, signal.SIG_DFL) if hasattr(signal, "SIGPIPE") else None
    # typer may vendor its own click: take its usage-error class from an exception it exports
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    try:
        code = app(standalone_mode=False)  # usage errors come back here, to be printed on one line
        if code == 130:  # typer turns a Ctrl-C it catches into this return code, silently
            err.print("interrupted")
        if code in (130, INTERRUPTED_AND_SAID):  # (INTERRUPTED_AND_SAID: the command said what it kept)
            _exit_interrupted()
        _exit(code if isinstance(code, int) else 0)
    except usage_error as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `spemusic` or `spemusic data` alone: the help
            text = e.ctx.get_help()  # typer's rich help prints itself and returns ""
            if text:
                print(text)
            _exit(0)
        command = e.ctx.command_path if e.ctx else "spemusic"
        err.print(f"[bold red]error:[/] {escape(e.format_message())} (see {escape(command)} --help)", highlight=False)
        _exit(e.exit_code)
    except typer.Abort:
        err.print("interrupted")
        _exit_interrupted()
    except SpemusicError as e:
        err.print(f"[bold red]error:[/] {escape(_message(e))}", highlight=False)
        _exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        _exit_interrupted()
    except OSError as e:
        where = e.filename or ("stdout" if e.errno in (errno.ENOSPC, errno.EPIPE, errno.EIO) else "")
        err.print(f"[bold red]error:[/] {escape(f'{where}: ' if where else '')}{escape(str(e.strerror or e))}",
                  highlight=False)
        _exit(1)


if __name__ == "__main__":
    main()
