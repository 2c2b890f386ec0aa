"""spemusic: long-context symbolic music generation with Performers and Stochastic Positional Encoding."""

__version__ = "0.1.0"

from .errors import MidiError, SpemusicError  # noqa: E402
from .model import ModelConfig, Performer  # noqa: E402
from .tokenizer import REMITokenizer, TokenizerConfig  # noqa: E402


def load_model(name_or_path="pop-piano", device="cpu"):
    """A model (eval mode) and its tokenizer from a shipped model name or a checkpoint path."""
    from .checkpoint import load_model as _load

    return _load(name_or_path, device=device)


__all__ = ["ModelConfig", "Performer", "REMITokenizer", "TokenizerConfig", "load_model",
           "SpemusicError", "MidiError", "__version__"]
