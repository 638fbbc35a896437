"""EAGLE-3 and DFlash export to vLLM's draft layouts, checked without vLLM.

A reference forward written from vLLM's ``LlamaForCausalLMEagle3`` semantics (stacked q/k/v and
gate/up as vLLM's loader builds them, hidden states taken as *inputs* of the layers listed in
``eagle_aux_hidden_state_layer_ids`` in ascending order, fused-residual norms, ``d2t`` offsets onto
the target vocabulary) reads only the exported folder and must reproduce our draft's logits.
The DFlash reference, written from vLLM's ``DFlashDraftModel`` semantics (context
``hidden_norm(fc(cat(hidden states entering layer id+1 for id in target_layer_ids)))`` projected to
K/V by each layer without its input layernorm, block ``[anchor, MASK x K]`` attending non-causally to
itself and to the context before the anchor, the target's embedding and head), reads the exported
draft and policy folders and must reproduce our block logits.
The end-to-end check against a running vLLM is tests/integrations/vllm/test_engine.py.

    .venv/bin/python -m pytest -q tests/integrations/vllm/test_export.py
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from integrations.vllm.engine import check_method
from integrations.vllm.export import check_vllm_cpu_head_dim, export_dflash, export_eagle3, export_policy
from repro.models.block_draft import BlockDraftConfig
from repro.models.dflash import DFlashDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft
from repro.models.policy import build_policy
from repro.models.taps import TapSpec
from repro.models.vocab import build_draft_vocab

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
    check_method("dflash")                              # exported now
    with pytest.raises(NotImplementedError, match="vLLM .*dspark"):
        check_method("dspark")


# -- DFlash -----------------------------------------------------------------------------------------------
def _dflash(policy, taps, block_size=4, num_layers=2, seed=5):
    torch.manual_seed(seed)
    d = DFlashDraft(BlockDraftConfig.from_policy(policy, num_layers=num_layers, tap_spec=taps,
                                                 block_size=block_size), policy)
    with torch.no_grad():                      # every weight, norms included, away from its init
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return d.eval()


def _dflash_reference(cfg, w, pw, hidden_states, ids, anchors):
    """Final-head logits ``[len(anchors), K+1, V]`` of the blocks at ``anchors`` of one sequence, vLLM's way."""
    dc = cfg["dflash_config"]
    eps, th = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    nh, g, hd, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_hidden_layers"]
    Bs, mask_id = cfg["block_size"], dc["mask_token_id"]
    assert dc["causal"] is False
    aux = torch.cat([hidden_states[j + 1][0] for j in dc["target_layer_ids"]], -1)   # entering layer j+1
    ctx = _rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    embed = pw["model.embed_tokens.weight"]
    head = pw.get("lm_head.weight", embed)
    S = ids.numel()
    out = []
    for a in anchors:
        qpos = torch.arange(a, a + Bs)
        h = embed[torch.tensor([int(ids[a])] + [mask_id] * (Bs - 1))]
        for i in range(L):
            p = f"layers.{i}."
            qkv_w = torch.cat([w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"],
                               w[p + "self_attn.v_proj.weight"]])
            qn, kn = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
            c_kv = ctx[:a] @ qkv_w[nh * hd:].T                                   # context: no input layernorm
            ck = _rope(_rms(c_kv[:, :g * hd].view(-1, g, hd), kn, eps), torch.arange(a), th)
            cv = c_kv[:, g * hd:].view(-1, g, hd)
            q, k, v = (_rms(h, w[p + "input_layernorm.weight"], eps) @ qkv_w.T).split([nh * hd, g * hd, g * hd], -1)
            q = _rope(_rms(q.view(-1, nh, hd), qn, eps), qpos, th)
            k = _rope(_rms(k.view(-1, g, hd), kn, eps), qpos, th)
            K = torch.cat([ck, k]).repeat_interleave(nh // g, 1)
            V = torch.cat([cv, v.view(-1, g, hd)]).repeat_interleave(nh // g, 1)
            att = (torch.einsum("qhd,khd->hqk", q, K) * hd ** -0.5).softmax(-1)   # no mask: all visible
            h = h + torch.einsum("hqk,khd->qhd", att, V).flatten(-2) @ w[p + "self_attn.o_proj.weight"].T
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            ga, gb = (_rms(h, w[p + "post_attention_layernorm.weight"], eps) @ gate_up.T).chunk(2, -1)
            h = h + (F.silu(ga) * gb) @ w[p + "mlp.down_proj.weight"].T
        out.append(_rms(h, w["norm.weight"], eps) @ head.T)
    assert all(a < S for a in anchors)
    return torch.stack(out)


@pytest.mark.parametrize("taps,block_size", [((1, 3, 5), 4), ((5, 1), 6)])
def test_exported_dflash_reproduces_our_blocks(policy, tmp_path, taps, block_size):
    spec = TapSpec(taps, "output", policy.num_layers)
    draft = _dflash(policy, spec, block_size=block_size, num_layers=len(taps))
    cfg, w = _load(export_dflash(draft, tmp_path / "d", max_position_embeddings=1024))
    _, pw = _load(export_policy(policy, tmp_path / "pol"))
    ids = torch.randint(0, policy.vocab_size - 1, (1, 14), generator=torch.Generator().manual_seed(7))
    anchors = [0, 1, 5, 9, 13]
    policy.set_taps(spec)
    with torch.no_grad():
        tr = policy.forward_train(ids, want_taps=True)
        a = torch.tensor([anchors])
        hid = draft.backbone.forward_blocks(ids, torch.cat(tr.taps, -1), a, torch.ones_like(a, dtype=torch.bool),
                                            attn_impl="dense")
        ours = draft.backbone.head(hid)[0].float()                               # [N, Bs, V]
        hs = policy.model(ids, output_hidden_states=True).hidden_states
    ref = _dflash_reference(cfg, w, pw, hs, ids[0], anchors)
    assert ref.shape == ours.shape == (len(anchors), block_size, policy.vocab_size)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    assert cfg["dflash_config"]["target_layer_ids"] == sorted(taps)


def test_exported_dflash_names_shapes_and_config(policy, tmp_path):
    draft = _dflash(policy, TapSpec((4, 2), "output", policy.num_layers), block_size=5, num_layers=2)
    cfg, w = _load(export_dflash(draft, tmp_path / "d", max_position_embeddings=1024))
    c = draft.cfg
    H, q, kv, I = c.target_hidden, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    want = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(2):
        p = f"layers.{i}."
        want.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                     p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                     p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                     p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,),
                     p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                     p + "mlp.down_proj.weight": (H, I)})
    assert {k: tuple(v.shape) for k, v in w.items()} == want            # no embed_tokens / lm_head: shared
    th = H
    torch.testing.assert_close(w["fc.weight"], torch.cat([draft.backbone.fc.weight[:, th:],
                                                          draft.backbone.fc.weight[:, :th]], 1))   # (2, 4) order
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["num_hidden_layers"] == 2
    assert (cfg["block_size"], cfg["vocab_size"], cfg["target_hidden_size"]) == (5, c.vocab_size, H)
    assert cfg["dflash_config"] == {"mask_token_id": c.mask_token_id, "target_layer_ids": [2, 4],
                                    "use_aux_hidden_state": True, "causal": False}
    with pytest.raises(TypeError, match="DFlashDraft"):
        export_dflash(_draft(policy, TapSpec((1, 3, 4), "output", 8)), tmp_path / "x")
    emb = _dflash(policy, TapSpec((0, 3), "input", policy.num_layers), num_layers=1)
    with pytest.raises(ValueError, match=r"target_layer_ids .*embedding"):   # input of layer 0: not representable
        export_dflash(emb, tmp_path / "y")
