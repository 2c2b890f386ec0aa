"""spemusic: long-context symbolic music generation with Performers and Stochastic Positional Encoding."""

__version__ = "0.1.0"

from .errors import MidiError, SpemusicError

# the model and the tokenizer (torch, symusic) load on first use: the command line starts, and
# handles Ctrl-C, before the heavy imports
_LAZY = {"ModelConfig": "nn.model", "Performer": "nn.model", "REMITokenizer": "tokens.tokenizer",
         "TokenizerConfig": "tokens.tokenizer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'spemusic' has no attribute {name!r}")


def load_model(name_or_path="pop-piano", device="cpu"):
    """A model (eval mode) and its tokenizer from a shipped model name or a checkpoint path."""
    from .nn.checkpoint import load_model as _load

    return _load(name_or_path, device=device)


__all__ = ["ModelConfig", "Performer", "REMITokenizer", "TokenizerConfig", "load_model",
           "SpemusicError", "MidiError", "__version__"]
