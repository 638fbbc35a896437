"""EAGLE-3 TTT attention over a right-padded batch (one masked SDPA per pass, kernels.attention.padded_ttt) against
the fp64 dense oracle (reference.eagle3_ttt_mask per row), values and gradients.

    .venv/bin/python -m pytest -q tests/attention/test_padded_ttt.py
"""
import pytest
import torch

from kernels.attention.padded_ttt import padded_ttt_attention, padded_ttt_mask
from kernels.attention.reference import dense_attention, eagle3_ttt_mask

pytestmark = pytest.mark.timeout(120)


def _inputs(R, S, H, G, D, passes, seed):
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_(True)
    return t(R, S, H, D), [t(R, S, G, D) for _ in range(passes + 1)], [t(R, S, G, D) for _ in range(passes + 1)]


def _oracle(q, ks, vs, scale):
    """Each row as one packed document of S through the dense oracle's mask."""
    R, S = q.shape[:2]
    P = len(ks) - 1
    mask = eagle3_ttt_mask(torch.tensor([0, S]), P)
    rows = [dense_attention(q[r], torch.cat([k[r] for k in ks]), torch.cat([v[r] for v in vs]), mask, scale)[0]
            for r in range(R)]
    return torch.stack(rows)


@pytest.mark.parametrize("passes", [0, 1, 2])
@pytest.mark.parametrize("S", [1, 7, 33])
def test_values_and_gradients_match_the_fp64_oracle(passes, S):
    R, H, G, D = 3, 4, 2, 8
    q, ks, vs = _inputs(R, S, H, G, D, passes, seed=S + 10 * passes)
    dout = torch.randn(R, S, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = padded_ttt_attention(q, ks, vs)
    got_grads = torch.autograd.grad(got, [q, *ks, *vs], dout)
    want = _oracle(q, ks, vs, D ** -0.5)
    want_grads = torch.autograd.grad(want, [q, *ks, *vs], dout)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    for i, (a, b) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=f"gradient {i}")


def test_right_padding_leaves_the_real_positions_unchanged():
    q, ks, vs = _inputs(2, 9, 4, 2, 8, 2, seed=3)
    pad = lambda x: torch.cat([x, torch.randn(2, 5, *x.shape[2:], dtype=x.dtype)], dim=1)
    short = padded_ttt_attention(q, ks, vs)
    long = padded_ttt_attention(pad(q), [pad(k) for k in ks], [pad(v) for v in vs])
    torch.testing.assert_close(long[:, :9], short, rtol=0, atol=1e-12)


def test_mask_shape_and_bad_inputs_are_refused():
    m = padded_ttt_mask(3, 1)
    assert m.tolist() == [[True, False, False, True, False, False],
                          [True, True, False, False, True, False],
                          [True, True, True, False, False, True]]
    q, ks, vs = _inputs(1, 4, 4, 2, 8, 1, seed=0)
    with pytest.raises(TypeError, match="floating-point"):
        padded_ttt_attention(q.detach().long(), ks, vs)
    with pytest.raises(ValueError, match="equally long"):
        padded_ttt_attention(q, ks, vs[:1])
    with pytest.raises(ValueError, match=r"k_passes\[1\]"):
        padded_ttt_attention(q, [ks[0], ks[1][:, :3]], vs)
    with pytest.raises(ValueError, match="mask must be"):
        padded_ttt_attention(q, ks, vs, mask=padded_ttt_mask(4, 2))
    with pytest.raises(ValueError, match="seq_len"):
        padded_ttt_mask(0, 1)


def test_the_attention_check_runs_the_padded_ttt_route_against_the_oracle(tmp_path):
    import json

    from repro.bench import attention_check as ac
    assert ac.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--paths", "padded_ttt"]) == 0
    rows = json.loads((tmp_path / "attention_check.json").read_text())["rows"]
    rows = [r for r in rows if r["path"] == "padded_ttt"]
    assert {r["backend"] for r in rows} == {"sdpa:default", "sdpa:math"}
    for r in rows:
        assert r["status"] == "PASS" and {"ttt2.out", "ttt3.out", "ttt3.dk2", "ttt3.dv0"} <= set(r["err"])
        assert 0 < r["worst"] < 1e-4                  # float32 against fp64: rounding, not zero
