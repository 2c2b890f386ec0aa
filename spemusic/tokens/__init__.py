"""The token language and the MIDI files it reads and writes: the REMI tokenizer and its grammar, beat and
chord annotations, the example pieces. Imports only the shared modules (spemusic.errors, options, files,
memory, words)."""
