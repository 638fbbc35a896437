"""Import direction: the drafts and the decoding primitives never import the rollout engine.

repro.decoding is the lower layer both repro.models and repro.rollout use; an import from repro.models or
repro.decoding into repro.rollout would close the circle the split removed.

    .venv/bin/python -m pytest -q tests/models/test_layering.py
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; function-level imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.timeout(30)
@pytest.mark.parametrize("package", ["repro/models", "repro/decoding"])
def test_no_import_up_into_the_engine(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files, f"no modules under {package}"
    bad = {str(f.relative_to(ROOT)): sorted(m for m in imported_modules(f) if m.split(".")[:2] == ["repro", "rollout"])
           for f in files}
    bad = {f: m for f, m in bad.items() if m}
    assert not bad, f"modules importing the rollout engine from below it: {bad}"


@pytest.mark.timeout(30)
def test_decoding_imports_no_model():
    bad = {str(f.relative_to(ROOT)): sorted(m for m in imported_modules(f) if m.startswith("repro.models"))
           for f in sorted((ROOT / "repro/decoding").glob("*.py"))}
    bad = {f: m for f, m in bad.items() if m}
    assert not bad, f"repro.decoding must not import the models: {bad}"
