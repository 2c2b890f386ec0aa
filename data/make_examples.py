"""Write the example prompts used in the README: data/examples/groove.mid and piano.mid.

    python data/make_examples.py
"""

from pathlib import Path

from spemusic.examples import drum_groove, piano_phrase

if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "examples"
    out.mkdir(exist_ok=True)
    drum_groove().dump(str(out / "groove.mid"))
    piano_phrase().dump(str(out / "piano.mid"))
    print(f"wrote {out / 'groove.mid'} and {out / 'piano.mid'}")
