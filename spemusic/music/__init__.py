"""What is read off a piece or made from it without the network: music metrics, keys, the harmonizer,
piano-roll pictures, audio. Imports only spemusic.tokens and the shared modules."""
