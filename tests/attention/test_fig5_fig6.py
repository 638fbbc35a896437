"""Figures 5 and 6's benchmark programs on the CPU at tiny sizes: the rows and same-run ratios they record
(CP=1 included: one GPU runs fig5 and fig6 at CP=1), the rows they skip with a reason, and fig6's flash-attn-4
block routes through the flash_attn.cute stand-in. Times are never asserted on (benchmarks measure, tests check).

    .venv/bin/python -m pytest -q tests/attention/test_fig5_fig6.py
"""
import json

import flash4_standin as standin
import pytest

from kernels.attention import backends
from kernels.attention.backends import flash4 as f4
from repro.bench import fig5, fig6
from repro.core.profile import bench_settings
from repro.core.timing import BenchRun

pytestmark = pytest.mark.timeout(300)


def _records(out):
    return {r["row"]: r for r in json.loads((out / "bench.json").read_text())["records"]}


def test_fig5_runs_at_cp1_packed_against_the_padded_batch(tmp_path):
    assert fig5.main(["--cp", "1", "--scale", "128", "--repeats", "1", "--out", str(tmp_path)]) == 0
    rec = _records(tmp_path)
    assert {"zigzag cp=1", "usp U=1 R=1 cp=1", "cp=1", "all"} <= set(rec)
    m = rec["cp=1"]["metrics"]
    assert m["usp_pad_factor"] > 2 and m["speedup_vs_best_usp"] > 0 and m["peak_mem_ratio_usp_over_zigzag"] > 0
    assert rec["zigzag cp=1"]["metrics"]["ring_bytes_fwd"] == 0
    assert bench_settings("h200", "fig5")["cp"] == [1]
    from repro.core.profile import ProfileError
    with pytest.raises(ProfileError, match="unknown profile 'nonsense'"):
        bench_settings("nonsense", "fig5")
    with pytest.raises(SystemExit, match="has no fig5: section"):
        bench_settings("paper-h100", "fig5")


def test_fig6_records_rows_and_same_run_ratios(tmp_path):
    assert fig6.main(["--cp", "1", "--tokens", "256", "--repeats", "1", "--kinds", "ttt,trunk,sdpa_cudnn,block",
                      "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["records"]
    measured = {r["row"] for r in rows if "time_s" in r["metrics"]}
    assert measured == {"ttt 256 cp=1", "trunk 256 cp=1", "block 256 cp=1"}
    skipped = next(r for r in rows if r["row"] == "sdpa_cudnn 256 cp=1")
    assert "CP=1 on a GPU" in skipped["params"]["skipped"] and not skipped["metrics"]
    ratio = next(r for r in rows if r["row"] == "ttt 256 cp=1" and "branch_overhead_pct" in r["metrics"])
    assert ratio["params"]["of"] == ["ttt", "trunk"]
    assert next(r for r in rows if r["row"] == "block cp=1")["metrics"]["max_time_s"] > 0
    assert next(r for r in rows if r["row"] == "ttt 256 cp=1")["params"]["backend_used"] == "sdpa_cpu"


def test_fig6_ratios_are_named_per_route(tmp_path):
    times = {("ttt", 1): 3.3, ("trunk", 1): 3.0, ("sdpa_cudnn", 1): 3.6, ("block", 1): 0.04, ("block_fused", 1): 0.01,
             ("block_flash4", 1): 0.02}
    routes = bench_settings("h200", "fig6")["block_routes"]
    with BenchRun(tmp_path, artifact="fig6", profile="h200", config={"device": "cuda"}, log_metrics=False) as b:
        fig6.record_ratios(b, 262144, [1], times, routes)
    got = {(r["row"], k): v for r in b.records for k, v in r["metrics"].items()}
    assert got[("ttt 256K cp=1", "branch_overhead_pct")] == pytest.approx(10.0)
    assert got[("trunk 256K cp=1", "speedup_vs_sdpa_cudnn")] == pytest.approx(1.2)
    assert got[("block_fused 256K cp=1", "speedup_vs_block")] == pytest.approx(4.0)
    assert got[("block_flash4 256K cp=1", "speedup_vs_block")] == pytest.approx(2.0)
    assert not any(row.startswith("block_flash4_rep") for row, _ in got)          # not measured: no ratio


def test_fig6_skips_what_cannot_run_here():
    cfg = {**bench_settings("cpu-tiny", "fig6"), "device": "cpu"}
    assert "CP=1 on a GPU" in fig6.unavailable("sdpa_cudnn", None, cfg, 1)
    assert "one rank" in fig6.unavailable("block", "fused", cfg, 2)
    assert "flash-attn-4" in fig6.unavailable("block", "flash4", cfg, 1)
    assert fig6.unavailable("block", "auto", cfg, 1) is None and fig6.unavailable("ttt", None, cfg, 4) is None
    with pytest.raises(SystemExit):
        fig6.main(["--kinds", "nonsense"])


@pytest.mark.parametrize("route", ["flash4", "prefix_full[flash4]", "fused"])
def test_fig6_flash4_block_routes_run_through_the_standin(monkeypatch, route):
    standin.install(monkeypatch)
    f4.reset_probe()
    monkeypatch.setattr(f4, "capability", lambda device: (9, 0))
    monkeypatch.setattr(f4.Flash4Backend, "unavailable_reason", lambda self, spec, device, dtype: None)
    try:
        cfg = {**bench_settings("cpu-tiny", "fig6"), "device": "cpu", "kind": "block", "route": route, "tokens": 300,
               "anchors": 8, "block": 4, "heads": 4, "kv_heads": 2, "head_dim": 8, "repeats": 1, "warmup": 1}
        res = fig6.measure(0, 1, cfg)
    finally:
        f4.reset_probe()
    assert len(res["samples"]) == 1 and res["local_tokens"] == 300
    names = [c[0] for c in standin.CALLS]
    assert (("func" in names) == (route != "prefix_full[flash4]")
            and ("varlen" in names) == (route == "prefix_full[flash4]"))
    assert res.get("backend_used") == (None if route == "fused" else route)


def test_fig6_torch_fold_route_is_the_replicated_route_on_torch_ops():
    b = backends.get("prefix_full[torch]:torch_fold")
    assert b.merge == "torch" and b.name == "prefix_full[torch]:torch_fold" and b.inner is backends.get("torch")
    assert backends.get("prefix_full[torch]").merge == "auto"
    cfg = {**bench_settings("cpu-tiny", "fig6"), "device": "cpu", "kind": "block",
           "route": "prefix_full[torch]:torch_fold", "tokens": 200, "anchors": 6, "block": 4, "heads": 4,
           "kv_heads": 2, "head_dim": 8, "repeats": 1, "warmup": 1}
    res = fig6.measure(0, 1, cfg)
    assert res["backend_used"] == "prefix_full[torch]:torch_fold" and res["fold_impl"] == "torch"
