"""The package's layers (docs/design.md, Package layout: the picture), checked twice:

- its folders: a subpackage imports only from itself and the folders FOLDERS lets it (those below
  it), and the shared modules at the top of spemusic/ import only each other;
- its modules' rows: a module imports only from its own row or the rows below (ROWS), across the
  folders too.

Every module has its folder and its row; imports are counted at module level and inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spemusic"

SHARED = ""  # the shared bottom-layer modules at the top of spemusic/ (errors, options, files, memory, words)
# each folder and the folders it may import from, top to bottom; music and nn sit side by side
FOLDERS = {
    "training": {"training", "generation", "music", "nn", "tokens", SHARED},
    "generation": {"generation", "music", "nn", "tokens", SHARED},
    "music": {"music", "tokens", SHARED},
    "nn": {"nn", "tokens", SHARED},
    "tokens": {"tokens", SHARED},
    SHARED: {SHARED},
}
# the commands and the entry points: at the top of spemusic/, above every folder
ENTRY_POINTS = {"cli", "__init__", "__main__", "_start"}

# top to bottom, as in the picture of docs/design.md
ROWS = [
    ["cli"],
    ["generation.pieces", "generation.play", "training.train", "training.evaluate", "training.release",
     "training.fit_harmony"],
    ["generation.settings", "generation.sampling", "generation.prompts", "generation.accompany", "training.data",
     "music.pianoroll", "music.audio", "music.metrics", "music.keys", "music.harmony"],
    ["nn.checkpoint", "nn.device", "generation.cache"],
    ["nn.model", "nn.step_graph"],
    ["nn.spe", "nn.spe_jax", "nn.attention", "nn.recurrent", "nn.positional", "nn.fused", "nn.compiled",
     "nn.recall"],
    ["tokens.grammar", "tokens.tokenizer", "tokens.vocabulary", "tokens.file_policy", "tokens.midi_repair",
     "tokens.encoding", "tokens.decoding", "tokens.repeats", "tokens.beats", "tokens.chords", "tokens.examples",
     "errors", "options", "files", "memory", "words"],
]


def _modules() -> dict[str, Path]:
    """Every module of the package by its name under spemusic ("nn.model", "cli")."""
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" or p.parent == PACKAGE}


def _folder(module: str) -> str:
    return module.rpartition(".")[0]


def _imports(module: str, path: Path) -> set[str]:
    """The spemusic modules a file imports (at module level or inside functions), named as in _modules:
    `from .x import y`, `from ..pkg.x import y`, `from ..pkg import x`, `import spemusic.pkg.x`."""
    package = module.split(".")[:-1]
    known = set(_modules()) | (set(FOLDERS) - {SHARED})
    found = set()

    def add(parts: list[str], names: list[str]):
        base = ".".join(parts)
        # `from pkg import module` names modules; `from pkg.module import name` names pkg.module
        named = {f"{base}.{n}" if base else n for n in names} & known
        found.update(named or ({base} if base else set()))

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level - 1 <= len(package), f"{module}: an import from outside spemusic"
                parts = package[: len(package) - (node.level - 1)]
                add(parts + (node.module.split(".") if node.module else []), [a.name for a in node.names])
            elif node.module and (node.module + ".").startswith("spemusic."):
                add(node.module.split(".")[1:], [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("spemusic."):
                    found.add(".".join(a.name.split(".")[1:]))
    return found


def test_every_module_has_a_folder_and_a_row():
    modules = set(_modules()) - ENTRY_POINTS - {"__init__"}
    folders = {_folder(m) for m in modules} | {SHARED}
    assert folders == set(FOLDERS), sorted(folders ^ set(FOLDERS))
    placed = [m for row in ROWS for m in row]
    assert len(placed) == len(set(placed)), "a module in two rows"
    assert modules | {"cli"} == set(placed), (sorted(modules - set(placed)), sorted(set(placed) - modules - {"cli"}))


def test_the_folders_are_layers():
    """FOLDERS is a layering: no two folders may import each other."""
    both = [(a, b) for a in FOLDERS for b in FOLDERS[a] if a != b and a in FOLDERS[b]]
    assert not both, both


def test_no_folder_imports_from_a_folder_above_it():
    upward = []
    for module, path in _modules().items():
        if module in ENTRY_POINTS:
            continue
        for dep in _imports(module, path):
            target = dep if dep in FOLDERS else _folder(dep)  # `from .. import nn`: the folder itself
            if dep in ENTRY_POINTS or target not in FOLDERS[_folder(module)]:
                upward.append(f"{module} -> {dep}")
    assert not upward, upward


def test_no_module_imports_from_a_row_above_it():
    level = {m: i for i, row in enumerate(ROWS) for m in row}
    modules = _modules()
    upward = [f"{name} -> {dep}" for name in level for dep in _imports(name, modules[name])
              if dep in level and level[dep] < level[name]]
    assert not upward, upward


def test_the_check_reads_every_kind_of_import():
    """_imports names the modules of relative, parent-relative and absolute imports alike (the checks above
    would pass on a parser that found nothing)."""
    modules = _modules()
    assert {"nn.checkpoint", "nn.compiled"} <= _imports("training.train", modules["training.train"])
    assert {"tokens.tokenizer", "music.metrics"} <= _imports("music.keys", modules["music.keys"])
    assert "nn.attention" in _imports("nn.model", modules["nn.model"])  # `from spemusic.nn.attention import`
    assert "nn.checkpoint" in _imports("__init__", modules["__init__"])
