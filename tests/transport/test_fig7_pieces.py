"""Figure 7's pure pieces: the real tap layouts placed on PP stages, the per-config summary of the
ranks' raw samples, and the figure/table maker on collected rows (no processes, no timing).

    .venv/bin/python -m pytest -q tests/transport/test_fig7_pieces.py
"""
import pandas as pd
import pytest

from repro.bench.fig7 import Fig7Config, config_for, fanin_layout, summarize_rows, unavailable
from repro.report.paper import load_paper_numbers

pytestmark = pytest.mark.timeout(120)


def test_real_tap_layouts_on_pp4():
    cfg = Fig7Config(pp=4, hidden=4096, tokens=(4096,))
    # Qwen3-8B: 36 layers, 9 per stage; L32 stays on the draft's stage
    eagle = fanin_layout(cfg, "eagle3", 4096)
    assert {s: [t.name for t in v] for s, v in eagle.sources.items()} == {0: ["embed", "L1"], 1: ["L17"]}
    dflash = fanin_layout(cfg, "dflash", 4096)  # L33 stays local
    names = {s: [t.name for t in v] for s, v in dflash.sources.items()}
    assert names == {0: ["L1"], 1: ["L9", "L17"], 2: ["L25"]}
    assert dflash.consumer_rank == 3 and dflash.rings[0].tap.max_nbytes == 4096 * 4096 * 2
    with pytest.raises(ValueError, match="layouts \\['medusa'\\]"):
        Fig7Config(layouts=("medusa",))


def test_settings_come_from_the_typed_profile_and_bad_transports_are_named():
    cpu, gpu = config_for("cpu-tiny"), config_for("h200")
    assert (cpu.device, cpu.transports, cpu.pp) == ("cpu", ("shm", "host_staging"), 4)
    assert (gpu.device, gpu.transports[0], gpu.hidden) == ("cuda", "cuda_ipc", 4096)
    assert config_for("cpu-tiny", {"pp": 2, "tokens": [64], "repeats": None}).tokens == (64,)
    with pytest.raises(ValueError, match=r"transports \['shm', 'nvlink'\]: expected a non-empty list of"):
        Fig7Config(transports=("shm", "nvlink"))


def test_p2p_is_measured_where_the_machine_allows_it():
    cpu = Fig7Config(transports=("shm", "p2p"))
    gpu = Fig7Config(device="cuda", transports=("cuda_ipc", "p2p"))
    assert unavailable("p2p", cpu, n_gpus=0) is None                           # gloo on the host
    assert unavailable("p2p", gpu, n_gpus=4) is None                           # NCCL, one GPU per stage
    assert "needs one GPU per stage: pp=4, 1 GPU(s) here" in unavailable("p2p", gpu, n_gpus=1)
    assert "CUDA tensors" in unavailable("cuda_ipc", cpu, 0) and "CPU tensors" in unavailable("shm", gpu, 1)
    assert unavailable("host_staging", gpu, 1) is None and unavailable("cuda_ipc", gpu, 1) is None


def _rank(rank, role, transport, base, with_tx, fanin=()):
    return {"rank": rank, "rows": [{"layout": "eagle3", "tokens": 64, "transport": transport, "rank": rank,
                                    "role": role, "bytes": 1_000_000, "n_taps": 3, "fanin_s": list(fanin),
                                    "compute_s": base, "compute_with_transfer_s": with_tx, "compute_iters": 1,
                                    "mismatches": 0}]}


def test_summary_of_raw_samples():
    ranks = [_rank(0, "source", "shm", [1.0, 1.0, 1.0], [1.1, 1.1, 1.1]),
             _rank(1, "source", "shm", [1.0, 1.0, 1.0], [1.3, 1.3, 1.3]),
             _rank(2, "idle", "shm", [1.0] * 3, [1.0] * 3),
             _rank(3, "draft", "shm", [2.0, 2.0, 2.0], [2.0, 2.2, 2.4], fanin=[0.002, 0.001, 0.003])]
    (rec,) = summarize_rows(ranks, Fig7Config())
    assert rec["fanin_s"] == 0.002 and rec["bandwidth_gbps"] == pytest.approx(0.5)
    assert rec["source_slowdown_pct"] == pytest.approx(20.0)   # mean of +10 % and +30 %
    assert rec["draft_slowdown_pct"] == pytest.approx(10.0)    # medians 2.2 / 2.0
    assert rec["all_ranks_slowdown_pct"] == pytest.approx(50.0 / 3)  # sources and draft; the idle rank is out


def test_report_builds_from_tidy_rows(tmp_path):
    from repro.report.artifacts.fig7 import build, summary_table
    rows = []
    for transport, fan in (("cuda_ipc", 0.001), ("p2p", 0.004), ("host_staging", 0.05)):
        for metric, v in (("fanin_s", fan), ("message_mb", 100.0), ("bandwidth_gbps", 100 / fan / 1e3)):
            rows.append(("pp=4/eagle3/T=4096/" + transport, metric, v))
    for metric, v in (("message_mb", 100.0), ("speedup_vs_host_staging", 50.0)):
        rows.append(("pp=4/eagle3/T=4096", metric, v))
    for metric in ("write_bandwidth_gbps", "speedup_vs_host_staging", "source_slowdown_pct",
                   "draft_slowdown_pct", "host_staging_slowdown_pct"):
        rows += [("pp=4", metric, 1.5), ("pp=4", metric + "_min", 1.0), ("pp=4", metric + "_max", 2.0)]
    base = {"artifact": "fig7", "profile": "h200", "hardware": "1xh200", "hardware_label": "gpu", "run": "r"}
    tidy = pd.DataFrame([{**base, "row": r, "step": i, "metric": m, "value": v}
                         for i, (r, m, v) in enumerate(rows)])
    paper = load_paper_numbers()
    paper = paper[paper["artifact"] == "fig7"]
    table = summary_table(tidy, paper)
    got = dict(zip(table["metric"], table["paper"]))
    assert got["speedup_vs_host_staging"] == "4.5-8.5" and len(table) == 5
    from repro.report.artifacts.fig7 import config_rows
    assert set(config_rows(tidy)["transport"].dropna()) == {"cuda_ipc", "p2p", "host_staging"}
    paths = build(tidy, paper, tmp_path)
    assert {p.suffix for p in paths} == {".pdf", ".png", ".csv", ".md"} and all(p.exists() for p in paths)
