"""Profiles: schema, the hardware check against a (fake) detected machine, missing local paths;
provenance detection; atomic writes; the top-level `kernels` package not colliding with transformers.

    .venv/bin/python -m pytest -q tests/report/test_profiles_and_env.py
"""
import json
import os

import pytest

from repro.core.io import write_json_atomic
from repro.core.profile import (
    ProfileError,
    available_profiles,
    check_servable,
    load_profile,
    missing_hardware,
    missing_paths,
)
from repro.core.provenance import git_state, hardware, provenance

pytestmark = pytest.mark.timeout(120)

CPU_BOX = {"cpu": {"usable_cores": 2, "memory_gb": 24.0}, "gpus": {"count": 0, "devices": []}}
H200_BOX = {"cpu": {"usable_cores": 16, "memory_gb": 128.0},
            "gpus": {"count": 1, "devices": [{"name": "NVIDIA H200", "memory_gb": 139.8}]}}


def test_every_profile_validates():
    assert set(available_profiles()) >= {"cpu-tiny", "h200", "paper-h100", "paper-gb200"}
    for name in available_profiles():
        assert load_profile(name)["name"] == name


def test_unknown_profile_names_the_choices():
    with pytest.raises(ProfileError, match=r"unknown profile 'a100'.*cpu-tiny"):
        load_profile("a100")


def test_hardware_check():
    assert missing_hardware(load_profile("cpu-tiny"), CPU_BOX) == []
    missing = missing_hardware(load_profile("h200"), CPU_BOX)
    assert any("1 GPU(s) (detected: none)" in m for m in missing)
    assert missing_hardware(load_profile("h200"), H200_BOX) == []
    missing = missing_hardware(load_profile("paper-h100"), H200_BOX)
    assert any("8 GPU(s)" in m for m in missing) and any("GPU model H100" in m for m in missing)


def test_missing_paths_are_each_named(tmp_path):
    prof = load_profile("paper-h100")
    missing = missing_paths(prof, {})
    assert any(m.startswith("checkpoint_root") for m in missing) and any("nemo_rl_dir" in m for m in missing)
    (tmp_path / "Qwen3-8B").mkdir()
    missing = missing_paths(prof, {"checkpoint_root": str(tmp_path), "nemo_rl_dir": str(tmp_path)})
    assert any("Qwen3.5-35B-A3B does not exist" in m for m in missing)
    assert not any("Qwen3-8B " in m for m in missing)
    assert any("has no nemo_rl/ package" in m for m in missing)


@pytest.mark.skipif(hardware()["gpus"]["count"] > 0, reason="checks the CPU-only refusal")
def test_check_servable_on_this_cpu_machine():
    check_servable(load_profile("cpu-tiny"), {})
    with pytest.raises(ProfileError, match=r"profile 'h200' cannot run on this machine .*GPU"):
        check_servable(load_profile("h200"), {})


def test_provenance_is_detected():
    p = provenance({"k": 1})
    hw = p["hardware"]
    assert hw["cpu"]["usable_cores"] >= 1 and hw["cpu"]["model"]
    assert hw["label"] in ("gpu", "cpu-emulated") and hw["tag"]
    assert p["software"]["torch"] and p["git"]["sha"] and p["config"] == {"k": 1}


def test_git_state_is_dirty_for_code_not_for_the_workflows_outputs(tmp_path):
    """A run that writes its results into the checkout (results/, paper_figures/) leaves the tree clean; a changed
    source file does not."""
    import subprocess
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "results" / "r.json").write_text('{"new": 1}')
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True


def test_write_atomic_leaves_nothing_half_written(tmp_path):
    path = tmp_path / "x" / "r.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object.__new__(type("Unserialisable", (), {"__str__": None}))})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(path.parent) == ["r.json"]


def test_kernels_package_does_not_collide_with_transformers():
    import transformers.utils.import_utils as iu

    import kernels
    assert not iu.is_kernels_available(), "transformers mistook the suite's kernels/ for HF kernels"
    assert not hasattr(kernels, "__version__")
    from transformers import Qwen3Config, Qwen3ForCausalLM
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=8))
    assert model(input_ids=__import__("torch").tensor([[1, 2, 3]])).logits.shape == (1, 3, 32)
