"""Write the example prompts used in the README: data/examples/groove.mid, piano.mid and melody.mid.

    python data/make_examples.py
"""

from pathlib import Path

from spemusic.tokens.examples import drum_groove, melody_line, piano_phrase

if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "examples"
    out.mkdir(exist_ok=True)
    drum_groove().dump(str(out / "groove.mid"))
    piano_phrase().dump(str(out / "piano.mid"))
    melody_line().dump(str(out / "melody.mid"))
    print(f"wrote {out / 'groove.mid'}, {out / 'piano.mid'} and {out / 'melody.mid'}")
