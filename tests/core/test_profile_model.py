"""The profile model: every shipped profile loads through it, and in every section a typo'd key, a wrong type and
a bad value fail before any job, naming the file, the key path, the value and what was expected.

    .venv/bin/python -m pytest -q tests/core/test_profile_model.py
"""
import copy
import os
import re
import subprocess
import sys

import pytest
import yaml

from repro.core.profile import ProfileError, available_profiles, load_profile, load_profile_model, parse_profile

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads(name):
    model = load_profile_model(name)
    assert model.name == name and load_profile(name)["name"] == name


def test_profiles_validate_without_importing_torch():
    """The workflow validates its profile at every parse, planning included: no torch import for that."""
    code = ("import sys; from repro.core.profile import available_profiles, load_profile_model\n"
            "for name in available_profiles(): load_profile_model(name)\n"
            "assert 'torch' not in sys.modules, 'validating a profile imported torch'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


def _at(tree: dict, path: str) -> dict:
    for key in path.split("/"):
        tree = tree[key]
    return tree


# (profile, section path in the YAML, a key of it and a value of the wrong type)
SECTIONS = [
    ("cpu-tiny", "hardware", "gpus", "one"),
    ("cpu-tiny", "envcheck", "copy_mb", 1.5),
    ("cpu-tiny", "rl", "vocab_size", "512"),
    ("cpu-tiny", "rl/policies/dense", "scale", 3),
    ("cpu-tiny", "rl/drafts/dflash", "lr", "fast"),
    ("cpu-tiny", "rl/grpo", "microbatch", "16"),
    ("cpu-tiny", "rl/workload", "val_size", [16]),
    ("cpu-tiny", "rl/rollout", "bucket_batch", "yes"),
    ("cpu-tiny", "table1", "steps", "ten"),
    ("cpu-tiny", "table2/pp_probe", "updates", "3"),
    ("cpu-tiny", "fig3", "baseline_seeds", 1),
    ("cpu-tiny", "fig4/rows/DSpark", "policy", 7),
    ("cpu-tiny", "fig5", "cp", "2,4"),
    ("cpu-tiny", "fig6", "tokens", 1024),
    ("cpu-tiny", "fig7", "hidden", "big"),
    ("cpu-tiny", "decode", "batch_sizes", "1"),
    ("cpu-tiny", "attention_check", "backends", "torch"),
    ("cpu-tiny", "attention_check/padded", "rows", "two"),
    ("paper-h100", "nemo_rl", "gpus_per_node", "8"),
    ("paper-h100", "nemo_rl/models/Qwen3-8B", "nodes", "one"),
]


def _key_path(section: str, key: str) -> str:
    parts = section.split("/") + [key]
    return "".join(p if i == 0 else f".{p}" for i, p in enumerate(parts))


@pytest.mark.parametrize("name,section,key,bad", SECTIONS, ids=[s[1] for s in SECTIONS])
def test_a_typo_and_a_wrong_type_are_named(tmp_path, name, section, key, bad):
    prof = load_profile(name)
    if section == "rl/rollout":
        prof["rl"]["rollout"] = prof["rl"].get("rollout") or {}
    typo = copy.deepcopy(prof)
    _at(typo, section)[key + "x"] = _at(typo, section).get(key)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(typo))
    with pytest.raises(ProfileError) as err:
        load_profile_model(str(path))
    msg = str(err.value)
    assert str(path) in msg and f"unknown key '{key}x'" in msg and "expected one of" in msg and key in msg, msg
    wrong = copy.deepcopy(prof)
    _at(wrong, section)[key] = bad
    with pytest.raises(ProfileError) as err:
        parse_profile(wrong, "profile file wrong.yaml")
    msg = str(err.value)
    assert "wrong.yaml" in msg and repr(bad) in msg and "invalid" in msg, msg
    assert key in msg, msg


@pytest.mark.parametrize("edit,message", [
    (lambda p: p["rl"]["drafts"]["dflash"].update(num_proposals=9),
     r"rl.drafts.dflash.num_proposals=9 is invalid: expected 3 for dflash with block_size=4"),
    (lambda p: p["table1"]["rows"]["Qwen3-8B/DFlash"].update(baseline="nobody"),
     r"baseline='nobody' is invalid: expected one of the section's rows"),
    (lambda p: p["fig3"]["rows"]["DSpark"].update(policy="huge"), r"policy='huge' is invalid: expected one of"),
    (lambda p: p["fig4"].update(grpo={"max_new_tokens": 0}), r"grpo.max_new_tokens=0 is invalid"),
    (lambda p: p["rl"]["drafts"]["eagle3"]["options"].update(block_size=4),
     r"rl.drafts.eagle3.options=\['block_size'\] is invalid"),
    (lambda p: p.update(tabel1={}), r"tabel1: unknown key 'tabel1'; expected one of .*table1"),
    (lambda p: p["rl"]["workload"].update(math_ops=[4, 2]), r"rl.workload.math_ops=\[4, 2\] is invalid: expected "
     r"\[lo, hi\] with 1 <= lo <= hi"),
    (lambda p: p["fig3"].update(workload={"math_ops": [6, 8]}), r"fig3.workload.math_ops=\[6, 8\] is invalid here: "
     r"set rl.workload.math_ops"),
])
def test_bad_values_and_references_are_named(edit, message):
    prof = load_profile("cpu-tiny")
    edit(prof)
    with pytest.raises(ProfileError, match=message):
        parse_profile(prof, "profile file cpu-tiny.yaml")


def test_the_loaded_dict_is_a_fresh_copy():
    a = load_profile("cpu-tiny")
    a["rl"]["grpo"]["lr"] = -1
    assert load_profile("cpu-tiny")["rl"]["grpo"]["lr"] > 0
    assert re.fullmatch(r"[a-z0-9-]+", load_profile_model("cpu-tiny").name)


def test_a_profile_extends_another(tmp_path):
    child = tmp_path / "cpu-tiny-wide.yaml"
    child.write_text(yaml.safe_dump({
        "extends": "cpu-tiny", "name": "cpu-tiny-wide",
        "hardware": {"min_cpu_cores": 3},                     # one key of a mapping: the rest inherited
        "decode": {"batch_sizes": [2]},                       # a list replaces the base's
        "fig7": None,                                         # null drops the base's section
    }))
    base, got = load_profile("cpu-tiny"), load_profile(child)
    assert "extends" not in got and got["name"] == "cpu-tiny-wide"
    assert got["hardware"] == {**base["hardware"], "min_cpu_cores": 3}
    assert got["decode"]["batch_sizes"] == [2] and got["decode"]["repeats"] == base["decode"]["repeats"]
    assert load_profile_model(child).fig7 is None and load_profile_model("cpu-tiny").fig7 is not None
    assert got["rl"] == base["rl"]
    assert load_profile_model("h100").decode == load_profile_model("h200").decode


def test_a_bad_or_circular_extends_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr("repro.core.profile.PROFILE_DIR", tmp_path)
    (tmp_path / "a.yaml").write_text("extends: b\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a\nname: b\n")
    (tmp_path / "c.yaml").write_text("extends: nowhere\nname: c\n")
    (tmp_path / "d.yaml").write_text("extends: [a]\nname: d\n")
    with pytest.raises(ProfileError, match=r"extends 'a' runs in a circle: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        load_profile("a")
    with pytest.raises(ProfileError, match=r"unknown profile 'nowhere'; expected one of a, b, c, d"):
        load_profile("c")
    with pytest.raises(ProfileError, match=r"extends \['a'\] is invalid: expected the name of a profile"):
        load_profile("d")


def test_an_edited_base_reaches_the_profiles_that_extend_it(tmp_path, monkeypatch):
    base = load_profile("cpu-tiny")
    monkeypatch.setattr("repro.core.profile.PROFILE_DIR", tmp_path)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**base, "name": "base"}))
    (tmp_path / "child.yaml").write_text("extends: base\nname: child\n")
    assert load_profile("child")["envcheck"]["copy_mb"] == base["envcheck"]["copy_mb"]
    edited = {**base, "name": "base", "envcheck": {**base["envcheck"], "copy_mb": 7}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(edited))
    os.utime(tmp_path / "base.yaml", ns=(1, 1))          # a different modification time, whatever the clock
    assert load_profile("child")["envcheck"]["copy_mb"] == 7
