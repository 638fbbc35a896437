"""repro reaches integrations/ only through repro.core.handoffs: every name there resolves, its keys are the
options repro offers, and no module under repro/ imports integrations/ (function-level imports included).

    .venv/bin/python -m pytest -q tests/core/test_handoffs.py
"""
import ast
import importlib
from pathlib import Path

import pytest

from repro.core import handoffs
from repro.core.specs import DRAFT_CHECKPOINT_FAMILIES, ROLLOUT_BACKENDS
from repro.plan import ENGINES

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def test_every_handoff_resolves_without_its_engine():
    """Nothing here needs vLLM or NeMo-RL installed: the integrations import them only where they run."""
    assert handoffs.rollout_engine("vllm").__name__ == "VllmRolloutEngine"
    assert callable(handoffs.draft_loader("eagle3")) and callable(handoffs.metric_mapper("nemo-rl"))
    assert callable(importlib.import_module(handoffs.NEMO_RL_RUN).main)


def test_handoff_keys_are_the_options_repro_offers():
    from integrations.nemo_rl.metrics import ENGINE
    assert set(handoffs.ROLLOUT_ENGINES) == set(ROLLOUT_BACKENDS) - {"suite"}
    assert set(handoffs.DRAFT_LOADERS) == set(DRAFT_CHECKPOINT_FAMILIES)
    assert set(handoffs.METRIC_MAPPERS) == set(ENGINES) - {"suite"} == {ENGINE}


@pytest.mark.parametrize("lookup,key", [(handoffs.rollout_engine, "sglang"), (handoffs.draft_loader, "dflash"),
                                        (handoffs.metric_mapper, "suite")])
def test_an_unknown_key_names_the_known_ones(lookup, key):
    with pytest.raises(ValueError, match=rf"{key}'; known: \["):
        lookup(key)


def test_repro_never_imports_integrations():
    bad = {}
    for path in sorted((ROOT / "repro").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            hits = [n for n in names if n.split(".")[0] == "integrations"]
            if hits:
                bad.setdefault(str(path.relative_to(ROOT)), []).extend(hits)
    assert not bad, f"repro modules importing integrations/ (name them in repro.core.handoffs instead): {bad}"
