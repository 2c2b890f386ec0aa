"""New pieces and continuations as MIDI: the library behind `spemusic generate` and `continue`.

    model, tok = spemusic.load_model("pop-piano")
    pieces = generate(model, tok, GenerationConfig(num=2, bars=8, seed=0))   # or generate(model, tok, bars=8, …)
    pieces.midis[0].dump("new.mid")

    prompt = load_prompt(Path("song.mid"), tok, prompt_bars=4)   # spemusic.generation.prompts
    pieces = continue_prompt(model, tok, prompt, bars=8, seed=1)
    pieces.midis[0].dump("song-continued.mid")  # the prompt's own notes, then the new bars

The command line adds what belongs to it: option checks, the progress bar, Ctrl-C, the files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import miditoolkit
import numpy as np

from ..nn.model import Performer
from ..tokens.tokenizer import REMITokenizer
from .prompts import Prompt, count_bars, merge_continuation
from .sampling import SampleResult, sample
from .settings import GenerationConfig

__all__ = ["GenerationConfig", "KeyMove", "Pieces", "accompany", "continue_prompt", "generate"]


@dataclass
class KeyMove:
    """Where a piece was found (tonic pitch class, mode) and the semitones it was moved by."""

    tonic: int
    mode: str
    shift: int


@dataclass
class Pieces:
    midis: list[miditoolkit.MidiFile]  # per piece: the new music (after the prompt's own notes, if any)
    result: SampleResult  # the sampler's: token ids per piece (transposed when a key was asked), seconds, …
    prompt_tokens: int  # the tokens before the sampled ones (1: BOS alone)
    prompt_bars: int
    keys: list[KeyMove] | None = None  # per piece, when a key was asked
    stopped_programs: list[int] | None = None  # programs of the prompt that no new bar plays
    new_programs: list[int] | None = None  # programs the new bars play
    chart: list[str] | None = None  # accompany: the chords played, one per bar (None: the model named them)

    @property
    def ids(self) -> list[np.ndarray]:
        """Per piece, its token ids BOS … EOS."""
        return self.result.ids

    def empty(self) -> list[int]:
        """The pieces that hold no note (an empty MIDI file is no piece)."""
        return [i for i, midi in enumerate(self.midis) if not any(inst.notes for inst in midi.instruments)]

    def new_tokens_and_bars(self, tokenizer: REMITokenizer) -> list[tuple[int, int]]:
        """Per piece, the tokens (EOS excluded) and bars it added."""
        return [(len(ids) - self.prompt_tokens - 1, count_bars(ids, tokenizer) - self.prompt_bars) for ids in self.ids]


def generate(model: Performer, tokenizer: REMITokenizer, config: GenerationConfig | None = None, *, on_token=None,
             should_stop=None, **settings) -> Pieces:
    """`config.num` new pieces of `length` tokens or `bars` bars (GenerationConfig; `settings`:
    its fields by name, in place of its values), each decoded to MIDI: with `key`, each moved from
    the key it was found in to that one. Sampling options left at None are the model's own."""
    return _pieces(model, tokenizer, None, False, GenerationConfig.of(config, **settings), on_token, should_stop)


def accompany(model: Performer, tokenizer: REMITokenizer, melody, config: GenerationConfig | None = None, *,
              harmonize: bool = True, on_token=None, should_stop=None, **settings) -> Pieces:
    """`config.num` accompaniments of a melody (accompany.load_melody), as long as it: the melody
    held as written, token by token, the model writing `parts` under it (default: bridge and
    piano) on `chords` (one per bar, repeating), else on the chart its harmonizer draws from the
    whole melody (`harmonize`; without, the model names each bar's chord as it writes, from the
    melody's first bar on: harmony.melody_chords). Each MIDI file holds the user's melody track
    exactly as it was, and the new parts on the melody file's timeline. `Pieces.chart`: the
    chords played (None where the model named its own)."""
    import io

    from ..music.harmony import melody_chords
    from .accompany import hold_melody, with_accompaniment

    config = GenerationConfig.of(config, **settings)
    parts = config.parts or ("bridge", "piano")
    if "melody" in parts:
        raise ValueError("accompany writes the parts under the melody, not the melody")
    chords = config.chords
    if chords is None:
        charted = melody_chords(model, melody.ids, tokenizer, harmonize)  # None: the model ships no harmonizer
        chords = None if charted is None else tuple(charted)
    config = replace(config.for_model(model), bars=melody.bars, length=None, chords=chords, parts=("melody", *parts))
    result = sample(model, tokenizer, config, held=hold_melody(melody.ids, tokenizer), on_token=on_token,
                    should_stop=should_stop)
    midis = [miditoolkit.MidiFile(file=io.BytesIO(with_accompaniment(melody, ids, tokenizer,
                                                                     config.overlaps).dumps_midi()))
             for ids in result.ids]
    return Pieces(midis, result, 1, 0, chart=None if chords is None else list(chords))


def continue_prompt(model: Performer, tokenizer: REMITokenizer, prompt: Prompt, config: GenerationConfig | None = None,
                    *, only_continuation: bool = False, on_token=None, should_stop=None, **settings) -> Pieces:
    """`config.num` continuations of a prompt (prompts.load_prompt), each merged into the prompt's
    own MIDI: its notes exactly as they were, then the new bars (`only_continuation`: the new
    bars alone)."""
    return _pieces(model, tokenizer, prompt, only_continuation, GenerationConfig.of(config, **settings), on_token,
                   should_stop)


def _pieces(model, tokenizer, prompt: Prompt | None, only_continuation: bool, config: GenerationConfig, on_token,
            should_stop) -> Pieces:
    config = config.for_model(model)
    config.check(tokenizer)
    result = sample(model, tokenizer, config, prompt=None if prompt is None else prompt.ids, on_token=on_token,
                    should_stop=should_stop)
    keys = _move_to_key(result, tokenizer, config.key) if config.key is not None else None
    prompt_tokens = 1 if prompt is None else len(prompt.ids)  # BOS, or the prompt's tokens
    stopped = new = None
    if prompt is not None:
        lo, hi = tokenizer.range("Program")
        before = {int(t) for t in prompt.ids if lo <= t < hi}
        after = {int(t) for ids in result.ids for t in ids[prompt_tokens:] if lo <= t < hi}
        stopped, new = sorted(before - after), sorted(after)
    midis = [tokenizer.decode(ids, config.overlaps) if prompt is None
             else merge_continuation(prompt, ids, tokenizer, only_continuation, config.overlaps) for ids in result.ids]
    if prompt is None and config.tempo is not None:
        for midi in midis:
            _write_tempo_exactly(midi, config.tempo)
    return Pieces(midis, result, prompt_tokens, 0 if prompt is None else count_bars(prompt.ids, tokenizer),
                  keys, stopped, new)


def _write_tempo_exactly(midi: miditoolkit.MidiFile, bpm: float) -> None:
    """The asked opening tempo as asked, not as its token's bin (90 BPM decodes as 91.4): every
    tempo event at the opening bin's value becomes `bpm`; the model's other tempos stay."""
    if midi.tempo_changes:
        opening = midi.tempo_changes[0].tempo
        for change in midi.tempo_changes:
            if abs(change.tempo - opening) < 1e-6:
                change.tempo = float(bpm)


def _move_to_key(result: SampleResult, tokenizer: REMITokenizer, key: tuple[int, str]) -> list[KeyMove]:
    """Each piece transposed from the key it was found in to `key` (result.ids replaced)."""
    from ..music.keys import estimate_key, shift_to, transpose_ids

    moves, moved = [], []
    for ids in result.ids:
        tonic, mode, _ = estimate_key(ids, tokenizer)
        shift = shift_to((tonic, mode), key)
        moved.append(transpose_ids(ids, tokenizer, shift))
        moves.append(KeyMove(tonic, mode, shift))
    result.ids = moved
    return moves
