"""Making music with a model: the sampler, the continuous cache, prompts, the held melody, pieces, live
play. Imports spemusic.nn, music, tokens and the shared modules; never spemusic.training."""
