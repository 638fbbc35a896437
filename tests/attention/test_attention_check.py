"""The GPU correctness check's harness (repro.bench.attention_check) on the CPU: it passes the CPU backends, a
wrong backend fails it (exit status 1, the failing rows named), a required backend that does not run here fails
it, and its flash4 rows (kernel, front ends, prefix_full, the one-call block route, the padded route) run
through the flash_attn.cute stand-in.

    .venv/bin/python -m pytest -q tests/attention/test_attention_check.py
"""
import json

import flash4_standin as standin
import pytest
import torch

from kernels.attention import backends
from kernels.attention.backends import flash4 as f4
from kernels.attention.backends.torch_ref import TorchBackend
from repro.bench import attention_check as ac
from repro.core.profile import bench_settings

pytestmark = pytest.mark.timeout(300)


def _run(tmp_path, *extra):
    rc = ac.main(["--profile", "cpu-tiny", "--out", str(tmp_path), *extra])
    return rc, json.loads((tmp_path / "attention_check.json").read_text())


def test_cpu_backends_pass_every_path(tmp_path, capsys):
    rc, res = _run(tmp_path, "--ring-world", "1,2")
    assert rc == 0 and res["verdict"] == "PASS" and res["backends"] == ["torch", "sdpa_cpu"]
    got = {(r["path"], r["backend"], r["case"]) for r in res["rows"]}
    for name in ("torch", "sdpa_cpu"):
        assert {("kernel", name, k) for k in ("causal", "full", "prefix")} <= got
        assert {(p, name, "lengths") for p in ("trunk", "ttt2", "ttt3")} | {("block", name, "anchors")} <= got
    assert {("ring", "torch", "C=1"), ("ring", "torch", "C=2")} <= got
    assert all(r["worst"] < 1e-5 for r in res["rows"] if "worst" in r)
    assert "split_dq" in next(r for r in res["rows"] if r["case"] == "full")["err"]
    assert "verdict: PASS" in capsys.readouterr().out
    assert res["provenance"]["config"]["profile"] == "cpu-tiny"


class _Broken(TorchBackend):
    """Returns +inf instead of -inf for rows without keys and perturbs the output."""
    name = "broken"

    def forward(self, q, k, v, spec, scale):
        out, lse = super().forward(q, k, v, spec, scale)
        return out * 1.01, torch.where(torch.isneginf(lse), float("inf"), lse)


def test_a_wrong_backend_fails_the_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(backends._REGISTRY, "broken", _Broken())
    monkeypatch.setattr(backends, "NAMES", (*backends.NAMES, "broken"))
    rc, res = _run(tmp_path, "--backends", "broken", "--paths", "kernel,trunk")
    assert rc == 1 and res["verdict"] == "FAIL"
    bad = {(r["path"], r["case"]) for r in res["rows"] if r["status"] == "FAIL"}
    assert {("kernel", "causal"), ("kernel", "full"), ("trunk", "lengths")} <= bad
    full = next(r for r in res["rows"] if r["case"] == "full")
    assert full["err"]["lse"] == float("inf")                      # the empty-row rule, checked exactly
    assert "verdict: FAIL" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ac.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--backends", "nonsense"])
    with pytest.raises(SystemExit):
        ac.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--paths", "everything"])


def test_a_required_backend_that_does_not_run_here_fails(tmp_path, monkeypatch):
    cfg = {**bench_settings("cpu-tiny", "attention_check"), "backends": ["torch", "flash4"], "require": ["flash4"]}
    res = ac.run_check("cpu-tiny", cfg, only={"kernel"})
    row = next(r for r in res["rows"] if r["backend"] == "flash4")
    assert res["verdict"] == "FAIL" and row["status"] == "FAIL" and "flash-attn-4" in row["error"]


def test_flash4_rows_through_the_standin(monkeypatch):
    standin.install(monkeypatch)
    f4.reset_probe()
    monkeypatch.setattr(f4, "capability", lambda device: (9, 0))
    monkeypatch.setattr(f4.Flash4Backend, "unavailable_reason", lambda self, spec, device, dtype: None)
    cfg = {**bench_settings("cpu-tiny", "attention_check"), "backends": ["flash4"],
           "padded": {**bench_settings("cpu-tiny", "attention_check")["padded"], "modes": []}}
    try:
        res = ac.run_check("cpu-tiny", cfg, only={"kernel", "ttt3", "block", "padded"})
    finally:
        f4.reset_probe()
    got = {(r["path"], r["backend"]): r for r in res["rows"]}
    assert {("block", "flash4"), ("block", "prefix_full[flash4]"), ("block", "fused"), ("padded", "flash4"),
            ("kernel", "flash4"), ("ttt3", "flash4")} <= set(got)
    assert res["verdict"] == "PASS", [(k, r.get("error"), r.get("worst")) for k, r in got.items()]
    assert all(r["worst"] < 1e-5 for r in got.values())
    assert res["used"]["flash4"]["prefix_fwd"] == "mask+sparse"


def test_the_ring_runs_the_block_drafts_on_their_prefix_route():
    """The ring check's backend without flash-attn-4 on a GPU is sdpa_cuda, which runs causal and full masks only:
    the block drafts' case (prefix masks) goes through prefix_full[sdpa_cuda], the other cases through sdpa_cuda
    itself (sdpa_cuda everywhere raised "cannot run mask kind 'prefix'" on one H100 without flash-attn-4). A backend
    that runs prefix masks keeps them."""
    prefix = ac.kernel_specs([5, 7, 3, 4])["prefix"]
    cases = ac.front_cases(bench_settings("cpu-tiny", "attention_check"))
    assert list(cases) == ["trunk", "ttt2", "ttt3", "block"]
    got = ac.ring_routes("sdpa_cuda", cases, prefix, torch.device("cuda"), torch.bfloat16)
    assert got == {"trunk": "sdpa_cuda", "ttt2": "sdpa_cuda", "ttt3": "sdpa_cuda", "block": "prefix_full[sdpa_cuda]"}
    assert ac.ring_routes("torch", cases, prefix, torch.device("cpu"), torch.float32) == dict.fromkeys(cases, "torch")
