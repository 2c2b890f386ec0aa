"""The network: SPE, linear attention and its recurrent form, the Performer, its checkpoints and its device.
Imports only spemusic.tokens (a checkpoint's tokenizer) and the shared modules."""
