"""Training and releasing a model: token caches, the training loop, NLL, releases, the harmony tables.
Imports spemusic.generation, nn, music, tokens and the shared modules."""
