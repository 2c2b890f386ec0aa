"""The modules' layers (docs/design.md, Package layout: the picture): a module imports only from its own
row or the rows below, and every module has its row."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spemusic"

# top to bottom, as in the picture of docs/design.md
ROWS = [
    ["cli"],
    ["pieces", "train", "evaluate", "play", "release"],
    ["sampling", "prompts", "accompany", "data", "pianoroll", "audio", "metrics", "keys", "harmony"],
    ["checkpoint", "device", "cache"],
    ["model"],
    ["spe", "spe_jax", "attention", "recurrent", "positional", "fused", "compiled", "recall"],
    ["grammar", "tokenizer", "beats", "chords", "files", "errors", "words", "options", "memory", "examples"],
]
ENTRY_POINTS = {"__init__", "__main__", "_start"}


def _imports(path: Path) -> set[str]:
    """The spemusic modules a file imports (at module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.module and node.module.startswith("spemusic."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("spemusic."))
    return found


def test_every_module_has_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - ENTRY_POINTS
    placed = {m for row in ROWS for m in row}
    assert modules == placed, (sorted(modules - placed), sorted(placed - modules))


def test_no_module_imports_from_a_layer_above_it():
    level = {m: i for i, row in enumerate(ROWS) for m in row}
    upward = [f"{name} -> {dep}" for name in level for dep in _imports(PACKAGE / f"{name}.py")
              if dep in level and level[dep] < level[name]]
    assert not upward, upward
