"""The decode artifact (repro.report.artifacts.decode) builds its table and figure from tidy rows alone.

    .venv/bin/python -m pytest -q tests/report/test_decode_artifact.py
"""
import pandas as pd
import pytest

from repro.report.artifacts import decode


def tidy(rows):
    return pd.DataFrame([{"artifact": "decode", "profile": "p", "hardware": "cpu-2c", "hardware_label": "cpu-emulated",
                          "run": "r", "engine": "suite", "row": row, "step": 0, "metric": m, "value": v}
                         for row, m, v in rows])


@pytest.mark.timeout(60)
def test_decode_table_and_figure(tmp_path):
    t = tidy([("suite-all/plain/b1", "ms_per_step", 2.0), ("suite-all/dspark/b1", "ms_per_step", 3.0),
              ("suite-all/dspark/b1", "speedup_over_al", 0.6), ("suite-all/dspark/b1", "speedup_cpu_over_al", 0.62),
              ("peer/hf-dynamic/b1", "ms_per_step", 2.5), ("floor/b1", "ms_per_step", 0.1),
              ("bound/dspark/b1", "verify_over_decode", 1.25), ("suite-all/plain/b4", "ms_per_step", 2.2),
              ("suite-whole_drafts/plain/b1", "ms_per_step", 2.0), ("suite-whole_drafts/eagle3/b1", "ms_per_step", 2.5),
              ("suite-compiled_drafts/plain/b1", "ms_per_step", 1.0), ("pretrain", "loss_last", 1.0)])
    rows = decode.decode_rows(t)
    assert set(rows["kind"]) == {"suite-all", "suite-whole_drafts", "suite-compiled_drafts", "peer/hf-dynamic", "floor",
                                 "bound"}
    got = rows.set_index(["kind", "family", "batch"])
    assert got.loc[("suite-all", "dspark", 1), "speedup_cpu_over_al"] == 0.62
    assert got.loc[("floor", "plain", 1), "ms_per_step"] == 0.1
    paths = decode.build(t, pd.DataFrame(), tmp_path)
    assert sorted(p.suffix for p in paths) == [".csv", ".md", ".pdf", ".png"]
    md = (tmp_path / "decode.md").read_text()
    assert "ours, cuda_graphs=all" in md and "peer/hf-dynamic" in md and "ours, cuda_graphs=whole_drafts" in md
    assert "ceiling_over_al" in md and "over_fastest_plain" in md
    with pytest.raises(ValueError, match="no decode rows"):
        decode.build(tidy([("pretrain", "loss_last", 1.0)]), pd.DataFrame(), tmp_path)


@pytest.mark.timeout(60)
def test_derived_columns_compare_with_the_fastest_plain_engine_and_the_ceiling():
    """over_fastest_plain divides by the fastest plain row of the machine and batch, a peer's included, never by
    another batch's or machine's; ceiling_over_al is occupancy over the family's own bound."""
    t = tidy([("suite-fused/plain/b1", "tokens_per_s", 1000.0), ("suite-all/plain/b1", "tokens_per_s", 200.0),
              ("peer/hf-static-compile/b1", "tokens_per_s", 500.0), ("suite-all/eagle3/b1", "tokens_per_s", 400.0),
              ("suite-fused/eagle3/b1", "tokens_per_s", 1500.0), ("suite-fused/eagle3/b1", "occupancy", 1.0),
              ("bound/eagle3/b1", "verify_over_decode", 1.25), ("suite-fused/plain/b16", "tokens_per_s", 9000.0),
              ("peer/hf-static-compile/b16", "tokens_per_s", 12000.0),
              ("suite-fused/eagle3/b16", "tokens_per_s", 6000.0),
              ("suite-fused/eagle3/b16", "occupancy", 0.8), ("bound/eagle3/b16", "verify_over_decode", 1.6),
              ("bound/dspark/b16", "verify_over_decode", 9.0)])
    other = tidy([("suite-fused/plain/b1", "tokens_per_s", 1.0), ("suite-fused/eagle3/b1", "tokens_per_s", 3.0)])
    other["hardware_label"] = "cpu-emulated, reference"          # the same tag, another run: its own fastest row
    got = decode.decode_rows(pd.concat([t, other])).set_index(["hardware_label", "kind", "family", "batch"])
    here = got.loc["cpu-emulated"]
    assert here.loc[("suite-all", "eagle3", 1), "over_fastest_plain"] == pytest.approx(0.4)
    assert here.loc[("suite-fused", "eagle3", 1), "over_fastest_plain"] == pytest.approx(1.5)
    assert here.loc[("suite-fused", "eagle3", 16), "over_fastest_plain"] == pytest.approx(0.5)
    assert here.loc[("suite-fused", "eagle3", 1), "ceiling_over_al"] == pytest.approx(0.8)
    assert here.loc[("suite-fused", "eagle3", 16), "ceiling_over_al"] == pytest.approx(0.5)
    assert pd.isna(here.loc[("suite-fused", "plain", 1), "over_fastest_plain"])     # plain rows get none
    assert got.loc[("cpu-emulated, reference", "suite-fused", "eagle3", 1), "over_fastest_plain"] == pytest.approx(3.0)
