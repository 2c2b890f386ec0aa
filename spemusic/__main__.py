"""`python -m spemusic …` and `torchrun -m spemusic train …`."""

from ._start import main

main()
