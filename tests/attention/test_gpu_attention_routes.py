"""The "pass" rows of repro.bench.gpu_attention: route names -> backends, and a CPU smoke run of the group."""
import json

import pytest

from kernels.attention.backends.tiled import TiledBackward
from repro.bench import gpu_attention

pytestmark = pytest.mark.timeout(120)


def test_pass_routes_build_the_named_backends():
    b = gpu_attention.pass_backend("sdpa_cuda-rep")
    assert b.name == "sdpa_cuda" and b.gqa_native is False
    t = gpu_attention.pass_backend("tiled[cudnn]@16384/0")
    assert isinstance(t, TiledBackward) and (t.tile, t.kv_tile, t.inner.name) == (16384, 0, "cudnn")
    assert t.inner.gqa_native is None                       # a fresh instance: probes GQA itself
    with pytest.raises(ValueError, match="torch"):
        gpu_attention.pass_backend("torch-rep")             # no GQA switch on the reference backend
    with pytest.raises(ValueError, match="unknown attention backend"):
        gpu_attention.pass_backend("tiled[nope]@8/0")


def test_pass_group_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    rc = gpu_attention.main(["--device", "cpu", "--tokens", "256", "--only", "pass", "--skip-checks",
                             "--pass-routes", "torch,tiled[torch]@64/0", "--out", str(tmp_path)])
    assert rc == 0
    rows = [r["row"] for r in json.loads((tmp_path / "fig6" / "bench.json").read_text())["records"]]
    assert rows == ["pass_fwd 256 torch cp=1", "pass 256 torch cp=1",
                    "pass_fwd 256 tiled[torch]@64/0 cp=1", "pass 256 tiled[torch]@64/0 cp=1"]
