"""gpu_rl's SFT warm-start cache across device calls: the key follows what SFT depends on, a cached warm start is
reused only when it holds every draft the rows need, and a new SFT keeps the drafts the cache held.

    .venv/bin/python -m pytest -q tests/rl/test_gpu_rl_sft_cache.py
"""
import copy
import json

from repro.bench import gpu_rl
from repro.report.profiles import load_profile


def test_key_follows_the_sft_inputs():
    prof = load_profile("cpu-tiny")
    k = gpu_rl.sft_cache_key(prof, "dense", "math")
    assert k == gpu_rl.sft_cache_key(copy.deepcopy(prof), "dense", "math")
    other = copy.deepcopy(prof)
    other["rl"]["sft"] = {**other["rl"]["sft"], "steps": other["rl"]["sft"]["steps"] + 1}
    assert gpu_rl.sft_cache_key(other, "dense", "math") != k
    assert gpu_rl.sft_cache_key(prof, "dense", "workplace") != k


def test_reuse_needs_every_draft_and_a_new_sft_keeps_the_cached_ones(tmp_path, monkeypatch):
    ran = []

    def fake_sft(cmd, log):             # stands in for `python -m repro.rl.sft`: writes what SFT would
        drafts = cmd[cmd.index("--drafts") + 1].split(",")
        out = tmp_path.joinpath(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "sft.json").write_text(json.dumps({"drafts": {d: {} for d in drafts if d}}))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("sft log")
        ran.append(drafts)

    monkeypatch.setattr(gpu_rl, "_job", fake_sft)
    prof, cache = load_profile("cpu-tiny"), str(tmp_path / "cache")
    args = ([], prof, "profile.yaml", "dense", "math")
    ws, reused = gpu_rl._warm_start(*args, ["dflash"], tmp_path / "call1", cache)
    assert not reused and ran == [["dflash"]]
    ws2, reused = gpu_rl._warm_start(*args, ["dflash"], tmp_path / "call2", cache)
    assert reused and ws2 == ws and len(ran) == 1
    assert (tmp_path / "call2" / "sft" / "dense-math" / "sft.json").exists()     # the record of the call
    _, reused = gpu_rl._warm_start(*args, ["eagle3"], tmp_path / "call3", cache)
    assert not reused and ran[-1] == ["dflash", "eagle3"]                          # keeps what it held
    _, reused = gpu_rl._warm_start(*args, ["dflash", "eagle3"], tmp_path / "call4", cache)
    assert reused and len(ran) == 2
