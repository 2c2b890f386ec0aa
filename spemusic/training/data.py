"""Token dataset cache: MIDI folder -> compact numpy arrays + JSON index, and training windows.

Layout of a cache directory:
    index.json   tokenizer config + fingerprint, one entry per file (path, split, offset, length,
                 size and mtime for reuse), skipped files with reasons, per-split token counts
    tokens-*.npy every file's token ids concatenated (uint16 when the vocabulary fits), named by
                 the index ("tokens"; caches written before that name have tokens.npy)
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MidiError, OptionError, SpemusicError
from ..files import check_output_folder, write_atomically
from ..options import LEAD_SHEET_BARS
from ..tokens.repeats import unseen_to_none
from ..tokens.tokenizer import (
    BAR,
    DURATION,
    EOS,
    PAD,
    PITCH,
    POSITION,
    PROGRAM,
    REPEAT,
    TEMPO,
    VELOCITY,
    REMITokenizer,
    TokenizerConfig,
)

SPLITS = ("train", "valid", "test")
MIDI_SUFFIXES = {".mid", ".midi"}
INDEX_VERSION = 1


def find_midi_files(folder: Path) -> list[Path]:
    """All MIDI files under `folder`, recursively (.mid/.midi, any case), in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in MIDI_SUFFIXES and p.is_file())


def hash_split(relpath: str, valid_percent: int = 5, test_percent: int = 5) -> str:
    """Deterministic split from a hash of the relative path: stable when files are added."""
    # surrogateescape: a file name that is not UTF-8 hashes as its own bytes
    bucket = int(hashlib.sha1(relpath.encode("utf-8", "surrogateescape")).hexdigest()[:8], 16) % 100
    if bucket < test_percent:
        return "test"
    if bucket < test_percent + valid_percent:
        return "valid"
    return "train"


def read_split_csv(csv_path: Path) -> dict[str, str]:
    """Map relative MIDI path -> split from a CSV with `midi_filename` and `split` columns
    (the Groove MIDI Dataset's info.csv). 'validation' is read as 'valid'."""
    try:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise SpemusicError(f"{csv_path}: cannot read split CSV ({e.strerror})") from None
    if not rows or "midi_filename" not in rows[0] or "split" not in rows[0]:
        raise SpemusicError(f"{csv_path}: split CSV needs 'midi_filename' and 'split' columns")
    aliases = {"validation": "valid", "val": "valid", "dev": "valid"}
    out = {}
    for row in rows:
        split = aliases.get(row["split"].strip().lower(), row["split"].strip().lower())
        if split not in SPLITS:
            raise SpemusicError(f"{csv_path}: unknown split {row['split']!r} for {row['midi_filename']}")
        out[row["midi_filename"].strip()] = split
    return out


BEAT_SUFFIXES = (".txt", ".beats")
CHORD_SUFFIXES = (".txt", ".lab", ".chords")


def find_annotation(folder: Path | None, relpath: str, suffixes: tuple[str, ...]) -> Path | None:
    """The annotation of a MIDI file in `folder`: by its relative path (sub/song.mid ->
    sub/song.txt), else by its stem alone (song.txt)."""
    if folder is None:
        return None
    rel = Path(relpath).with_suffix("")
    for base in (rel, Path(rel.name)):
        for suffix in suffixes:
            p = folder / base.with_name(base.name + suffix)
            if p.is_file():
                return p
    return None


def default_cache_dir(midi_dir: Path, config: TokenizerConfig, beats_dir: Path | None = None,
                      chords_dir: Path | None = None) -> Path:
    """Where `train` keeps the cache of a MIDI folder when none is named: the data may be read-only."""
    root = Path(os.environ.get("SPEMUSIC_CACHE", Path.home() / ".cache" / "spemusic"))
    source = str(midi_dir.resolve())
    if beats_dir or chords_dir:  # (a plain folder keeps the cache name it had before annotations)
        source += "".join(f"|{Path(d).resolve()}" if d else "|" for d in (beats_dir, chords_dir))
    key = hashlib.sha1(source.encode()).hexdigest()[:10]
    return root / "datasets" / f"{midi_dir.resolve().name}-{key}-{config.fingerprint()}"


_worker_tokenizer: REMITokenizer | None = None


def _init_worker(config_dict: dict) -> None:
    global _worker_tokenizer
    _worker_tokenizer = REMITokenizer(TokenizerConfig.from_dict(config_dict))


def _encode_one(job: tuple[str, str | None, str | None]) -> tuple[str, np.ndarray | None, str | None]:
    path, beats, chords = job
    try:
        return path, _worker_tokenizer.encode(path, beats=beats, chords=chords), None
    except MidiError as e:
        return path, None, str(e)
    except Exception as e:  # noqa: BLE001 - one odd file must not stop a whole collection
        return path, None, f"{path}: {type(e).__name__}: {e}".splitlines()[0]


@dataclass
class TokenCache:
    """A prepared dataset: token ids of every file, by split."""

    path: Path
    index: dict
    tokens: np.ndarray

    @property
    def tokenizer(self) -> REMITokenizer:
        return REMITokenizer(TokenizerConfig.from_dict(self.index["tokenizer"]))

    def files(self, split: str) -> list[dict]:
        if split == "all":
            return list(self.index["files"])
        return [f for f in self.index["files"] if f["split"] == split]

    def sequences(self, split: str) -> list[np.ndarray]:
        return [self.tokens[f["offset"]: f["offset"] + f["length"]] for f in self.files(split)]

    @classmethod
    def load(cls, path: Path) -> TokenCache:
        path = Path(path)
        index_path = path / "index.json"
        if not index_path.is_file():
            raise SpemusicError(f"{path}: not a spemusic data cache (no index.json)")
        try:
            index = json.loads(index_path.read_text())
            if index.get("format") != "spemusic-cache" or index.get("version") != INDEX_VERSION:
                raise ValueError("unknown format")
            tokens = np.load(path / index.get("tokens", "tokens.npy"), mmap_mode="r")
        except (ValueError, KeyError, OSError) as e:
            raise SpemusicError(f"{path}: broken data cache ({e}); delete it and run `spemusic data prepare` again") from None
        return cls(path, index, tokens)


def _file_key(p: Path) -> list:
    st = p.stat()
    return [st.st_size, int(st.st_mtime)]


def _current_cache(cache_dir: Path, config: TokenizerConfig, keys: dict, csv_key: str | None,
                   beats_dir: Path | None, chords_dir: Path | None) -> TokenCache | None:
    """The cache already in `cache_dir` if it was made from these very files, annotations, split
    list and tokenizer; None if there is none or it is stale (a cache of another tokenizer is an
    error: its folder is not ours to overwrite)."""
    if not (cache_dir / "index.json").is_file():
        return None
    try:
        old = TokenCache.load(cache_dir)
    except SpemusicError:
        return None
    if old.index["fingerprint"] != config.fingerprint():
        raise SpemusicError(f"{cache_dir}: holds a cache made with another tokenizer config; choose another folder")
    same_annotations = [old.index.get(k) for k in ("beats", "chords")] == [
        str(d.resolve()) if d else None for d in (beats_dir, chords_dir)]
    if old.index["source_keys"] == keys and old.index.get("split_csv_sha1") == csv_key and same_annotations:
        return old
    return None


def _tokenize_files(jobs: list[tuple], config: TokenizerConfig, workers: int,
                    progress=None) -> dict[str, tuple[np.ndarray | None, str | None]]:
    """path -> (token ids, None) or (None, the reason it failed), for every (path, beats, chords)
    job; in a process pool when there are enough files to pay for it."""
    results = {}
    task = progress.add_task("tokenizing", total=len(jobs)) if progress is not None else None
    if workers > 1 and len(jobs) > 8:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(config.to_dict(),)) as pool:
            outcomes = pool.map(_encode_one, jobs, chunksize=16)
            for path, ids, err in outcomes:
                results[path] = (ids, err)
                if task is not None:
                    progress.advance(task)
    else:
        _init_worker(config.to_dict())
        for job in jobs:
            path, ids, err = _encode_one(job)
            results[path] = (ids, err)
            if task is not None:
                progress.advance(task)
    return results


def _skip_reason(rel: str, path: str, err: str | None) -> str:
    """Why a file was skipped, listed under its relative path (which the reason need not repeat)."""
    reason = err.replace(path, rel) if err else "unknown error"
    return reason[len(rel) + 2:] if reason.startswith(f"{rel}: ") else reason


def _split_counts(entries: list[dict]) -> dict:
    """Files and tokens of each split."""
    counts = {s: {"files": 0, "tokens": 0} for s in SPLITS}
    for e in entries:
        counts[e["split"]]["files"] += 1
        counts[e["split"]]["tokens"] += e["length"]
    return counts


def _index_entries(rel: list[str], paths: list[str], results: dict, splits_by_path: dict | None, split_csv):
    """The cache index's entries (path, split, offset, length) of the files tokenized, the skipped
    ones with their reasons, and the token arrays in the entries' order."""
    entries, skipped, arrays, offset = [], [], [], 0
    for r, p in zip(rel, paths):
        ids, err = results[p]
        split = splits_by_path.get(r) if splits_by_path is not None else hash_split(r)
        if ids is None or split is None:
            skipped.append({"path": r, "reason": _skip_reason(r, p, err) if ids is None
                            else f"not listed in {Path(split_csv).name}"})
            continue
        entries.append({"path": r, "split": split, "offset": offset, "length": int(len(ids))})
        arrays.append(ids)
        offset += len(ids)
    return entries, skipped, arrays


def _check_prepare_folders(midi_dir: Path, cache_dir: Path, config: TokenizerConfig, beats_dir, chords_dir):
    """prepare's folders refused before any work when wrong; the annotation folders as Paths (or None)."""
    if chords_dir is not None and not config.chords:
        raise SpemusicError("chord annotations need a tokenizer with chord tokens (TokenizerConfig(chords=True))")
    if not midi_dir.is_dir():
        raise SpemusicError(f"{midi_dir}: {'not a folder' if midi_dir.exists() else 'no such folder'} "
                            "(give a folder of MIDI files)")
    for d, what in ((beats_dir, "beats"), (chords_dir, "chords")):
        if d is not None and not Path(d).is_dir():
            raise SpemusicError(f"{d}: {'not a folder' if Path(d).exists() else 'no such folder'} "
                                f"(--{what} takes a folder of annotation files)")
    check_output_folder(cache_dir, option="cache folder")
    return (Path(beats_dir) if beats_dir is not None else None), (Path(chords_dir) if chords_dir is not None else None)


def prepare(
    midi_dir: Path,
    cache_dir: Path,
    config: TokenizerConfig | None = None,
    split_csv: Path | None = None,
    workers: int | None = None,
    progress=None,
    beats_dir: Path | None = None,
    chords_dir: Path | None = None,
) -> tuple[TokenCache, bool]:
    """Tokenize every MIDI file under `midi_dir` into `cache_dir`. Returns (cache, reused).

    beats_dir / chords_dir: folders of beat and chord annotations, matched to the MIDI files by
    relative path, then by stem (`find_annotation`). A file without a beat annotation keeps its
    own meter, one without a chord annotation gets no Chord tokens; one whose annotation does not
    fit is skipped with the reason. Chords need a config with ``chords=True`` (made so when
    chords_dir is given and config is None).

    Re-running on an unchanged folder with the same tokenizer config reuses the cache. A cache made
    with another tokenizer config is never reused (the fingerprint is part of the index)."""
    midi_dir, cache_dir = Path(midi_dir), Path(cache_dir)
    config = config or TokenizerConfig(chords=chords_dir is not None)
    beats_dir, chords_dir = _check_prepare_folders(midi_dir, cache_dir, config, beats_dir, chords_dir)
    files = find_midi_files(midi_dir)
    if not files:
        raise SpemusicError(f"{midi_dir}: no MIDI files (.mid, .midi) found")
    if split_csv is None and (midi_dir / "info.csv").is_file():
        split_csv = midi_dir / "info.csv"
    splits_by_path = read_split_csv(split_csv) if split_csv else None
    rel = [p.relative_to(midi_dir).as_posix() for p in files]
    beat_files = {r: find_annotation(beats_dir, r, BEAT_SUFFIXES) for r in rel}
    chord_files = {r: find_annotation(chords_dir, r, CHORD_SUFFIXES) for r in rel}
    # an annotation that changes invalidates the cache like its MIDI file does
    keys = {r: _file_key(p) + [_file_key(a) if a else None for a in (beat_files[r], chord_files[r])]
            if (beats_dir or chords_dir) else _file_key(p) for r, p in zip(rel, files)}
    csv_key = hashlib.sha1(Path(split_csv).read_bytes()).hexdigest() if split_csv else None

    old = _current_cache(cache_dir, config, keys, csv_key, beats_dir, chords_dir)
    if old is not None:
        return old, True

    tokenizer = REMITokenizer(config)
    paths = [str(p) for p in files]
    jobs = [(str(p), *(str(a) if a else None for a in (beat_files[r], chord_files[r]))) for r, p in zip(rel, files)]
    results = _tokenize_files(jobs, config, workers or min(os.cpu_count() or 1, 8), progress)
    entries, skipped, arrays = _index_entries(rel, paths, results, splits_by_path, split_csv)
    if not entries:
        raise SpemusicError(f"{midi_dir}: none of the {len(files)} MIDI files could be tokenized")

    dtype = np.uint16 if len(tokenizer) < 2**16 else np.int32
    tokens = np.concatenate(arrays).astype(dtype)
    index = {
        "format": "spemusic-cache",
        "version": INDEX_VERSION,
        "source": str(midi_dir.resolve()),
        "tokenizer": config.to_dict(),
        "fingerprint": config.fingerprint(),
        "vocab_size": len(tokenizer),
        "vocab_used": int(len(np.unique(tokens))),
        "split_csv": str(split_csv) if split_csv else None,
        "split_csv_sha1": csv_key,
        "beats": str(beats_dir.resolve()) if beats_dir else None,
        "chords": str(chords_dir.resolve()) if chords_dir else None,
        "annotated": {"beats": sum(1 for e in entries if beat_files[e["path"]]),
                      "chords": sum(1 for e in entries if chord_files[e["path"]])},
        "splits": _split_counts(entries),
        "files": entries,
        "skipped": skipped,
        "source_keys": keys,
    }
    _write_cache_atomically(cache_dir, tokens, index)
    return TokenCache(cache_dir, index, np.load(cache_dir / index["tokens"], mmap_mode="r")), False


def _write_cache_atomically(cache_dir: Path, tokens: np.ndarray, index: dict) -> None:
    """The new tokens under a new name, then the index that names them (each via a temporary name
    and a rename), then the old tokens go: until the new index is in place the old cache stays
    whole, so a failure (a full disk) loses nothing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, tokens)
    data = buf.getvalue()
    index["tokens"] = f"tokens-{hashlib.sha1(data).hexdigest()[:12]}.npy"
    write_atomically(data, cache_dir / index["tokens"])
    write_atomically(json.dumps(index).encode(), cache_dir / "index.json")
    for old in cache_dir.glob("tokens*.npy"):
        if old.name != index["tokens"]:
            old.unlink(missing_ok=True)


def open_dataset(data: Path, config: TokenizerConfig | None = None, progress=None, beats_dir: Path | None = None,
                 chords_dir: Path | None = None) -> TokenCache:
    """DATA is a prepared cache or a MIDI folder (prepared on the fly into the default cache dir,
    with the beat and chord annotations of beats_dir and chords_dir)."""
    data = Path(data)
    if (data / "index.json").is_file():
        return TokenCache.load(data)
    if not data.exists():
        raise SpemusicError(f"{data}: no such file or folder")
    if not data.is_dir():
        raise SpemusicError(f"{data}: expected a folder of MIDI files or a data cache")
    config = config or TokenizerConfig(chords=chords_dir is not None)
    cache, _ = prepare(data, default_cache_dir(data, config, beats_dir, chords_dir), config, progress=progress,
                       beats_dir=beats_dir, chords_dir=chords_dir)
    return cache


class WindowSampler:
    """Training windows of `seq_len + 1` tokens starting at bar boundaries, padded with PAD at the
    end of a piece, with random transposition of pitched notes (drums untouched, pitches kept in
    range). A share `piece_starts` of windows start at a piece's beginning (BOS, first bar and
    its time signature), the rest uniformly over all bar starts of the split. Piece starts are
    drawn in proportion to the pieces' bars, as the other windows are: drawn per piece, the Groove
    set's 2-bar fills (most of its train files, little of its music) opened most windows from BOS.

    Why the share: generation from scratch starts at BOS, and the first bar's time signature is
    then the model's to choose. Drawn uniformly over bar starts, piece starts would be one window
    in 260 for POP909 (mostly bars of one beat), too few to learn that choice: a model trained so
    picked a meter rare in the data for most pieces (bars of 2 to 8 beats, only the first one played).
    A model with a bar echo holds the bars it opens with, so it needs more of them (train --piece-starts)."""

    def __init__(self, cache: TokenCache, split: str, seq_len: int, max_transpose: int = 6,
                 lead_sheet: float = 0.0, piece_starts: float = 0.1, kit_swaps: float = 0.0):
        self.tokenizer = cache.tokenizer
        self.seq_len = seq_len
        self.max_transpose = max_transpose
        if lead_sheet and not self.tokenizer.config.parts:
            raise OptionError("{lead_sheet} needs a model with parts (melody, bridge, piano): give {parts}")
        self.lead_sheet = lead_sheet
        self.piece_starts = piece_starts
        self.kit_swaps = kit_swaps
        self.sequences = [np.asarray(s, dtype=np.int64) for s in cache.sequences(split)]
        if not self.sequences:
            raise SpemusicError(f"{cache.path}: the {split} split is empty")
        starts = []
        bar = self.tokenizer.bar_id
        for i, seq in enumerate(self.sequences):
            s = np.concatenate([[0], np.flatnonzero(seq == bar)])
            starts.append(np.stack([np.full_like(s, i), s], axis=1))
        self.starts = np.concatenate(starts)
        bars = np.array([len(s) for s in starts], dtype=np.float64)
        self.piece_weights = bars / bars.sum()
        self.pitch_lo, self.pitch_hi = self.tokenizer.range("Pitch")

    def window(self, seq_index: int, start: int, lead_sheet_bars: int = 0) -> np.ndarray:
        """seq_len + 1 tokens from `start`, PAD after the piece's end; with lead_sheet_bars, the
        first that many bars as a lead sheet (start: a bar line)."""
        out = np.full(self.seq_len + 1, self.tokenizer.pad_id, dtype=np.int64)
        piece = self.sequences[seq_index][start: start + (2 if lead_sheet_bars else 1) * (self.seq_len + 1)]
        if lead_sheet_bars:  # (notes taken out: more of the piece may fit)
            piece = lead_sheet(piece, self.tokenizer, lead_sheet_bars)[: self.seq_len + 1]
        out[: len(piece)] = piece
        return unseen_to_none(out, self.tokenizer) if self.tokenizer.config.repeats else out

    def transpose(self, window: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.max_transpose == 0:
            return window
        is_pitch = (window >= self.pitch_lo) & (window < self.pitch_hi)
        # a Pitch token follows its Program token: pitched notes are those not after Program_drums
        prev = np.concatenate([[-1], window[:-1]])
        pitched = is_pitch & (prev != self.tokenizer.drum_program_id)
        if not pitched.any():
            return window
        pitches = window[pitched] - self.pitch_lo
        lo = max(-self.max_transpose, -int(pitches.min()))
        hi = min(self.max_transpose, 127 - int(pitches.max()))
        from ..music.keys import transpose_ids

        return transpose_ids(window, self.tokenizer, int(rng.integers(lo, hi + 1)))

    def sample(self, rng: np.random.Generator, batch_size: int, augment: bool = True) -> np.ndarray:
        at_start = rng.random(batch_size) < self.piece_starts
        picks = rng.integers(0, len(self.starts), size=batch_size)
        pieces = rng.choice(len(self.sequences), size=batch_size, p=self.piece_weights)
        # lead sheets only inside pieces: from BOS the model still opens a song with all its parts
        lead = (rng.random(batch_size) < self.lead_sheet) & ~at_start
        bars = rng.integers(1, LEAD_SHEET_BARS + 1, size=batch_size)
        batch = [self.window(pieces[i], 0) if at_start[i] else self.window(*self.starts[picks[i]], bars[i] * lead[i])
                 for i in range(batch_size)]
        if augment:
            batch = [self.transpose(w, rng) for w in batch]
            if self.kit_swaps:  # (drawn only then: runs without it draw the windows they always did)
                swap = rng.random(batch_size) < self.kit_swaps
                batch = [swap_kit(w, self.tokenizer, rng) if swap[i] else w for i, w in enumerate(batch)]
        return np.stack(batch)


# Parts of a kit a drummer plays the same figure on (General MIDI, and the Groove set's edge hits
# 22 and 59): the time on the hi-hat or on the ride, the backbeat on the snare or as a side stick,
# the accents on one crash or the other
KIT_SWAPS = (((42, 51), (22, 59)), ((38, 37),), ((49, 57), (55, 52)))


def swap_kit(window: np.ndarray, tokenizer: REMITokenizer, rng: np.random.Generator) -> np.ndarray:
    """The window's drums with each of KIT_SWAPS exchanged with probability 1/2 (at least one),
    the same way through the window, each onset's notes sorted again by (program, pitch) as the
    tokenizer writes them. Why: a model that learns the Groove set's habits (time on the hi-hat)
    drifts back to them from a prompt that keeps time elsewhere; the swapped windows make the
    prompt, not the habit, tell which drum comes next."""
    chosen = rng.random(len(KIT_SWAPS)) < 0.5
    if not chosen.any():
        chosen[rng.integers(len(KIT_SWAPS))] = True
    lo, hi = tokenizer.range("Pitch")
    table = np.arange(hi - lo)
    for pairs in (p for p, c in zip(KIT_SWAPS, chosen) if c):
        for a, b in pairs:
            table[a], table[b] = b, a
    # a drum note is Program_drums, Pitch, Velocity (no Duration)
    starts = np.flatnonzero(window[:-2] == tokenizer.drum_program_id)
    if len(starts) == 0:
        return window
    out = window.copy()
    out[starts + 1] = lo + table[window[starts + 1] - lo]
    # notes of one onset are contiguous: sort them by (onset, program, pitch), onset counted by
    # the Position and Bar tokens before them
    p_lo, p_hi = tokenizer.range("Position")
    onset = np.cumsum((window == tokenizer.bar_id) | ((window >= p_lo) & (window < p_hi)))[starts]
    order = np.lexsort((out[starts + 1], out[starts], onset))
    notes = out[starts[:, None] + np.arange(3)]
    out[starts[:, None] + np.arange(3)] = notes[order]
    return out


def lead_sheet(ids: np.ndarray, tokenizer: REMITokenizer, bars: int) -> np.ndarray:
    """`ids` (from a bar line on) with the notes of every part but the melody taken out of its first
    `bars` bars, and the Positions left empty: the melody and the chords, as a lead sheet has them.

    Why: a model trained on whole songs predicts the accompaniment from the accompaniment before it
    (its key, its figure) and barely reads the melody. Moving the melody of whole songs a semitone
    against their piano barely changes the piano's pitches' NLL (docs/design.md). After a lead sheet's bars the
    accompaniment has only the melody and the chords to go on, as when it accompanies a melody
    it is given (`spemusic accompany`), and the chords there are predicted from the melody alone."""
    ids = np.asarray(ids, dtype=np.int64)
    bar_at = np.flatnonzero(ids == tokenizer.bar_id)
    end = int(bar_at[bars]) if len(bar_at) > bars else len(ids)
    head, kinds = ids[:end], tokenizer.kinds[ids[:end]]
    # a note is its Program token and the Pitch, Velocity, Duration tokens after it
    is_program = kinds == PROGRAM
    owner = np.maximum.accumulate(np.where(is_program, np.arange(end), -1))
    of_note = is_program | np.isin(kinds, (PITCH, VELOCITY, DURATION))
    melody = tokenizer.part_id("melody")
    drop = of_note & (owner >= 0) & (head[np.maximum(owner, 0)] != melody)
    # in time order a Tempo sits at an onset, which may not hold it alone: that onset keeps its notes
    onset = np.maximum.accumulate(np.where((kinds == POSITION) | (kinds == BAR), np.arange(end), -1))
    drop &= ~np.isin(onset, onset[kinds == TEMPO])
    if tokenizer.config.repeats:  # the other parts' marks: nothing of theirs is left to repeat
        marks = np.flatnonzero(kinds == REPEAT)
        bar_of = np.cumsum(head == tokenizer.bar_id)[marks]
        head = head.copy()
        head[marks[1:][bar_of[1:] == bar_of[:-1]]] = tokenizer.range("Repeat")[0]
    kept = head[~drop]
    kept_kinds = tokenizer.kinds[kept]
    # a Position with nothing after it (the next token another Position, a Bar, the end)
    after = np.r_[kept_kinds[1:], BAR]
    empty = (kept_kinds == POSITION) & np.isin(after, (POSITION, BAR, EOS, PAD))
    return np.concatenate([kept[~empty], ids[end:]])


def fixed_windows(cache: TokenCache, split: str, seq_len: int, max_windows: int = 64) -> np.ndarray:
    """Deterministic evaluation windows: consecutive `seq_len + 1`-token windows from the start of
    each piece (one token of overlap so that every token is a target once), PAD-filled at the end."""
    tok = cache.tokenizer
    windows = []
    for seq in cache.sequences(split):
        seq = np.asarray(seq, dtype=np.int64)
        for start in range(0, max(len(seq) - 1, 1), seq_len):
            w = np.full(seq_len + 1, tok.pad_id, dtype=np.int64)
            piece = seq[start: start + seq_len + 1]
            w[: len(piece)] = piece
            windows.append(unseen_to_none(w, tok) if tok.config.repeats else w)
    if not windows:
        raise SpemusicError(f"{cache.path}: the {split} split is empty")
    # spread the chosen windows over the whole split, not just its first pieces
    picks = np.linspace(0, len(windows) - 1, num=min(max_windows, len(windows))).round().astype(int)
    return np.stack([windows[i] for i in np.unique(picks)])


def trained_vocabulary(cache: TokenCache, max_transpose: int) -> list[int]:
    """The token ids a model trained on the cache's train split sees: those its songs hold, with
    the pitches and chord roots the transpositions of the sampler (up to ±max_transpose
    semitones) reach. The sampler keeps to these (a token never seen in training still gets a
    small probability: one program change in ~30 pop-piano pieces opened a second track)."""
    tok = cache.tokenizer
    lo, hi = tok.range("Pitch")
    seen = np.zeros(len(tok), dtype=bool)
    pitched = np.zeros(hi - lo, dtype=bool)  # pitches of pitched notes: drums are not transposed
    for seq in cache.sequences("train"):
        seq = np.asarray(seq)
        seen[seq] = True
        after_drum = np.concatenate([[False], seq[:-1] == tok.drum_program_id])
        pitched[seq[(seq >= lo) & (seq < hi) & ~after_drum] - lo] = True
    pitches = np.flatnonzero(pitched)
    for shift in range(-max_transpose, max_transpose + 1):
        moved = pitches + shift
        seen[lo + moved[(moved >= 0) & (moved < hi - lo)]] = True
    if tok.config.chords:
        c_lo, c_hi = tok.range("Chord")
        roots = seen[c_lo:c_hi - 1].reshape(12, -1)  # root-major: 12 roots x qualities, then N
        moved = np.zeros_like(roots)
        for shift in range(-max_transpose, max_transpose + 1):  # roots move with the pitches
            moved |= np.roll(roots, shift, axis=0)
        seen[c_lo:c_hi - 1] = moved.reshape(-1)
    return [int(i) for i in np.flatnonzero(seen)]
