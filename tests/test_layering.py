"""Data flows one way: audio -> features -> encoder -> decoder -> text; evaluation,
distillation and sweeps sit above the lanes and call them, never the other way round."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "audiofast"
# package -> the audiofast packages it must not import (not even lazily inside a function)
FORBIDDEN = {
    "models": ("asr", "stream", "eval", "training", "sweep", "diffusion", "distill", "scale"),
    "asr": ("stream", "eval", "training", "sweep", "diffusion", "distill", "scale"),
    "stream": ("eval", "training", "sweep", "diffusion", "distill", "scale"),
    "eval": ("training", "sweep", "distill", "scale"),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n.split(".")[1] for n in names if n.startswith("audiofast.") and n.count(".") >= 1}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer):
    wrong = {str(p.relative_to(PACKAGE)): sorted(_imports(p) & set(FORBIDDEN[layer]))
             for p in (PACKAGE / layer).rglob("*.py")}
    assert not {k: v for k, v in wrong.items() if v}, wrong
