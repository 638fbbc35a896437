"""EAGLE-3 export to vLLM's draft layout, checked without vLLM.

A reference forward written from vLLM's ``LlamaForCausalLMEagle3`` semantics (stacked q/k/v and
gate/up as vLLM's loader builds them, hidden states taken as *inputs* of the layers listed in
``eagle_aux_hidden_state_layer_ids`` in ascending order, fused-residual norms, ``d2t`` offsets onto
the target vocabulary) reads only the exported folder and must reproduce our draft's logits.
The end-to-end check against a running vLLM is tests/rollout/test_vllm_backend.py.

    .venv/bin/python -m pytest -q tests/rollout/test_vllm_export.py
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from repro.models.eagle3 import Eagle3Config, Eagle3Draft
from repro.models.policy import build_policy
from repro.models.taps import TapSpec
from repro.models.vocab import build_draft_vocab
from repro.rollout.vllm_backend import check_method
from repro.rollout.vllm_export import check_vllm_cpu_head_dim, export_eagle3, export_policy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def policy():
    return build_policy("qwen3", "tiny", seed=0, head_dim=32)


def _draft(policy, taps, draft_vocab=0, seed=3):
    counts = torch.arange(policy.vocab_size, 0, -1).float()
    maps = build_draft_vocab(counts[torch.randperm(policy.vocab_size, generator=torch.Generator().manual_seed(1))],
                             draft_vocab) if draft_vocab else (None, None)
    torch.manual_seed(seed)
    d = Eagle3Draft(Eagle3Config.from_policy(policy, tap_spec=taps, draft_vocab_size=draft_vocab), *maps)
    d.init_from_policy(policy)
    with torch.no_grad():                      # perturb every weight, norms included, so each one matters
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return d.eval()


def _load(path):
    from safetensors.torch import load_file
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float()[:, None], torch.cat([ang, ang], -1).sin().float()[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _vllm_reference(cfg, w, hidden_states, ids):
    """Pass-0 and pass-1 (first chain step) target-vocabulary logits of one sequence, vLLM's way."""
    eps, th = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    nh, g, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    aux = torch.cat([hidden_states[j][0] for j in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]], -1)
    qkv_w = torch.cat([w["midlayer.self_attn.q_proj.weight"], w["midlayer.self_attn.k_proj.weight"],
                       w["midlayer.self_attn.v_proj.weight"]])             # vLLM's stacked qkv_proj
    gate_up = torch.cat([w["midlayer.mlp.gate_proj.weight"], w["midlayer.mlp.up_proj.weight"]])
    embed, S = w["embed_tokens.weight"], ids.numel()

    def layer(e, h, pos):
        x = torch.cat([_rms(e, w["midlayer.input_layernorm.weight"], eps),
                       _rms(h, w["midlayer.hidden_norm.weight"], eps)], -1)
        q, k, v = (x @ qkv_w.T).split([nh * hd, g * hd, g * hd], -1)
        return _rope(q.view(-1, nh, hd), pos, th), _rope(k.view(-1, g, hd), pos, th), v.view(-1, g, hd)

    def finish(h, attn):
        res = h + attn.flatten(-2) @ w["midlayer.self_attn.o_proj.weight"].T
        gu = _rms(res, w["midlayer.post_attention_layernorm.weight"], eps) @ gate_up.T
        a, b = gu.chunk(2, -1)
        pre = (F.silu(a) * b) @ w["midlayer.mlp.down_proj.weight"].T + res
        lg = _rms(pre, w["norm.weight"], eps) @ w["lm_head.weight"].T
        full = torch.full((lg.shape[0], cfg["vocab_size"]), float("-inf"))
        tid = torch.arange(lg.shape[1]) + w["d2t"] if "d2t" in w else torch.arange(lg.shape[1])
        full[:, tid] = lg
        return pre, full

    def attend(q, K, V, mask):                                                    # GQA, explicit softmax
        K, V = K.repeat_interleave(nh // g, 1), V.repeat_interleave(nh // g, 1)
        s = torch.einsum("qhd,khd->hqk", q, K) * hd ** -0.5
        s = s.masked_fill(~mask[None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1), V)

    h0 = aux @ w["fc.weight"].T
    pos = torch.arange(S)
    e1 = embed[F.pad(ids[1:], (0, 1))]                                             # x_{i+1}
    q0, k0, v0 = layer(e1, h0, pos)
    pre0, out0 = finish(h0, attend(q0, k0, v0, pos[None, :] <= pos[:, None]))
    e2 = embed[F.pad(ids[2:], (0, 2))]                                             # x_{i+2}, one step on
    q1, k1, v1 = layer(e2, pre0, pos + 1)                                          # RoPE position + 1
    out1 = []
    for i in range(S):                  # chain query at root i: trunk keys j <= i, then its own key
        K, V = torch.cat([k0[: i + 1], k1[i:i + 1]]), torch.cat([v0[: i + 1], v1[i:i + 1]])
        out1.append(attend(q1[i:i + 1], K, V, torch.ones(1, i + 2, dtype=torch.bool)))
    _, out1 = finish(pre0, torch.cat(out1))
    return out0, out1


def _ours_full_vocab(draft, logits):
    full = torch.full((*logits.shape[:-1], draft.cfg.vocab_size), float("-inf"))
    full[..., torch.arange(draft.d2t.numel()) + draft.d2t] = logits
    return full


@pytest.mark.parametrize("taps,draft_vocab", [((1, 3, 4), 0), ((4, 1, 3), 96)])
def test_exported_eagle3_reproduces_our_forward(policy, tmp_path, taps, draft_vocab):
    spec = TapSpec(taps, "output", policy.num_layers)
    draft = _draft(policy, spec, draft_vocab)
    out = export_eagle3(draft, tmp_path / "d", max_position_embeddings=1024)
    cfg, w = _load(out)
    ids = torch.randint(0, policy.vocab_size, (1, 12), generator=torch.Generator().manual_seed(7))
    policy.set_taps(spec)
    with torch.no_grad():
        tr = policy.forward_train(ids, want_taps=True)
        ours = draft.ttt_forward(ids, torch.cat(tr.taps, -1), attn_impl="dense")
        hs = policy.model(ids, output_hidden_states=True).hidden_states     # HF: [emb, out_0, ..., norm]
    ref0, ref1 = _vllm_reference(cfg, w, hs, ids[0])
    mine0, mine1 = _ours_full_vocab(draft, ours[0][0]), _ours_full_vocab(draft, ours[1][0])
    fin = torch.isfinite(ref0)
    assert torch.equal(fin, torch.isfinite(mine0))                               # same draft vocabulary
    assert int(fin[0].sum()) == (draft_vocab or policy.vocab_size)
    torch.testing.assert_close(mine0[fin], ref0[fin], atol=2e-5, rtol=1e-4)
    # pass 1 at index i embeds x_{i+2}: compare where that token exists (i <= S-3)
    torch.testing.assert_close(mine1[:-2][fin[:-2]], ref1[:-2][fin[:-2]], atol=2e-5, rtol=1e-4)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sorted(t + 1 for t in taps)


def test_exported_names_shapes_and_config(policy, tmp_path):
    draft = _draft(policy, TapSpec((1, 3, 4), "output", policy.num_layers), draft_vocab=64)
    cfg, w = _load(export_eagle3(draft, tmp_path / "d", max_position_embeddings=1024))
    c = draft.cfg
    H, T = c.hidden_size, c.target_hidden
    want = {"fc.weight": (H, 3 * T), "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
            "midlayer.self_attn.q_proj.weight": (c.num_heads * c.head_dim, 2 * H),
            "midlayer.self_attn.k_proj.weight": (c.num_kv_heads * c.head_dim, 2 * H),
            "midlayer.self_attn.v_proj.weight": (c.num_kv_heads * c.head_dim, 2 * H),
            "midlayer.self_attn.o_proj.weight": (H, c.num_heads * c.head_dim),
            "midlayer.post_attention_layernorm.weight": (H,),
            "midlayer.mlp.gate_proj.weight": (c.intermediate_size, H),
            "midlayer.mlp.up_proj.weight": (c.intermediate_size, H),
            "midlayer.mlp.down_proj.weight": (H, c.intermediate_size), "norm.weight": (H,),
            "lm_head.weight": (64, H), "embed_tokens.weight": (c.vocab_size, H), "d2t": (64,),
            "t2d": (c.vocab_size,)}
    assert {k: tuple(v.shape) for k, v in w.items()} == want
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(64) + w["d2t"], torch.nonzero(w["t2d"]).flatten())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["target_hidden_size"]) == (64, c.vocab_size, T)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]    # input convention
    # a full-vocabulary draft has no maps: vLLM has no d2t parameter for it
    _, w_full = _load(export_eagle3(_draft(policy, TapSpec((1, 3, 4), "output", 8)), tmp_path / "f"))
    assert "d2t" not in w_full and "t2d" not in w_full


def test_export_policy_and_bad_input(policy, tmp_path):
    p = export_policy(policy, tmp_path / "pol")
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["head_dim"] == 32 and any(f.suffix == ".safetensors" for f in p.iterdir())
    with pytest.raises(TypeError, match="Eagle3Draft"):
        export_eagle3(policy, tmp_path / "x")
    with pytest.raises(ValueError, match="head_dim=16"):
        check_vllm_cpu_head_dim(16, "the policy")
    with pytest.raises(ValueError, match="one of"):
        check_method("medusa")
    for m in ("dflash", "dspark"):
        with pytest.raises(NotImplementedError, match=f"vLLM .*{m}"):
            check_method(m)
