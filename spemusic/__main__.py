"""`python -m spemusic …` and `torchrun -m spemusic train …`."""

from .cli import main

main()
