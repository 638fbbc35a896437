"""Load an EAGLE-3 draft checkpoint in the vLLM / SpecForge layout into our ``Eagle3Draft``.

The paper's rows start from the families' released drafts (e.g. a Qwen3-8B EAGLE-3 checkpoint), which
are folders in the layout vLLM's ``LlamaForCausalLMEagle3`` loads: ``config.json`` (``draft_vocab_size``,
``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``: taps as inputs of those
layers, ascending) and ``*.safetensors`` with ``fc``, ``midlayer.*`` (or ``layers.0.*``), ``norm``,
``lm_head``, optional ``embed_tokens`` and ``d2t``/``t2d``. This is the inverse of
``repro.rollout.vllm_export.export_eagle3``: the draft must already have the checkpoint's shape
(build it with ``Eagle3Config.from_policy(policy, tap_spec=..., draft_vocab_size=...)``); every
mismatch is named before any weight is copied. ``fc``'s column blocks are put back in the draft's tap
order. A checkpoint without ``embed_tokens`` keeps the draft's (initialised from the policy).

    from repro.models.eagle3_import import load_eagle3_checkpoint
    load_eagle3_checkpoint(draft, "/ckpt/Qwen3-8B-EAGLE3")
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

_LAYER_PARAMS = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj",
                 "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                 "mlp.down_proj")


def _read_tensors(root: Path) -> dict[str, torch.Tensor]:
    files = sorted(root.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file
        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    bins = sorted(root.glob("pytorch_model*.bin"))
    if bins:
        out = {}
        for f in bins:
            out.update(torch.load(f, map_location="cpu", weights_only=True))
        return out
    raise FileNotFoundError(f"EAGLE-3 checkpoint {root} has no *.safetensors or pytorch_model*.bin weights")


def _expect(what: str, got, want) -> None:
    if got != want:
        raise ValueError(f"EAGLE-3 checkpoint {what} is {got!r}, but the draft was built with {want!r}")


def load_eagle3_checkpoint(draft, path: str | Path) -> dict:
    """Copy the checkpoint at ``path`` into ``draft`` (an ``Eagle3Draft``); returns the checkpoint's config."""
    from repro.models.eagle3 import Eagle3Draft
    if not isinstance(draft, Eagle3Draft):
        raise TypeError(f"load_eagle3_checkpoint needs an Eagle3Draft, got {type(draft).__name__}")
    root = Path(path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"EAGLE-3 checkpoint folder {root} has no config.json")
    cfg = json.loads((root / "config.json").read_text())
    c = draft.cfg
    _expect("hidden_size", cfg.get("hidden_size"), c.hidden_size)
    _expect("num_attention_heads", cfg.get("num_attention_heads"), c.num_heads)
    _expect("num_key_value_heads", cfg.get("num_key_value_heads"), c.num_kv_heads)
    _expect("target_hidden_size", cfg.get("target_hidden_size", cfg.get("hidden_size")), c.target_hidden)
    _expect("draft_vocab_size", cfg.get("draft_vocab_size", cfg.get("vocab_size")), c.draft_vocab_size)
    ours = list(c.tap_spec.as_input_layers())
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        _expect("eagle_aux_hidden_state_layer_ids (taps, input of layer, ascending)", list(aux), sorted(ours))
    t = _read_tensors(root)
    prefix = "midlayer." if any(k.startswith("midlayer.") for k in t) else "layers.0."

    def take(name: str) -> torch.Tensor:
        if name not in t:
            raise KeyError(f"EAGLE-3 checkpoint {root} lacks weight {name!r} (has {sorted(t)[:8]}...)")
        return t[name]

    th, order = c.target_hidden, sorted(range(len(ours)), key=lambda i: ours[i])
    fc = take("fc.weight")
    _expect("fc.weight shape", tuple(fc.shape), tuple(draft.fc.weight.shape))
    blocks = [fc[:, j * th:(j + 1) * th] for j in range(len(ours))]          # ascending tap order
    fc_ours = torch.empty_like(fc)
    for j, i in enumerate(order):                                            # block j belongs to tap i
        fc_ours[:, i * th:(i + 1) * th] = blocks[j]
    src = {"fc.weight": fc_ours, "norm.weight": take("norm.weight"), "lm_head.weight": take("lm_head.weight")}
    for p in _LAYER_PARAMS:
        src[f"{p.split('.')[-1]}.weight" if p.startswith("self_attn") else f"{p}.weight"] = take(f"{prefix}{p}.weight")
    if "embed_tokens.weight" in t:
        src["embed_tokens.weight"] = t["embed_tokens.weight"]
    if "d2t" in t:                                  # offsets: target id = draft id + d2t
        src["d2t"] = t["d2t"].long()
        if "t2d" in t:
            src["t2d"] = t["t2d"].bool()
        else:                                       # vLLM does not need t2d; it follows from d2t
            t2d = torch.zeros_like(draft.t2d)
            t2d[torch.arange(src["d2t"].numel()) + src["d2t"]] = True
            src["t2d"] = t2d
    own = draft.state_dict()
    for k, v in src.items():                        # every check before the first copy
        _expect(f"{k} shape", tuple(v.shape), tuple(own[k].shape))
    with torch.no_grad():
        for k, v in src.items():
            own[k].copy_(v.to(own[k].dtype))
    return cfg
