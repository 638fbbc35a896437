"""Load an EAGLE-3 draft checkpoint in the vLLM / SpecForge layout into our ``Eagle3Draft``.

The paper's rows start from the families' released drafts (e.g. a Qwen3-8B EAGLE-3 checkpoint), which
are folders in the layout vLLM's ``LlamaForCausalLMEagle3`` loads: ``config.json`` (``draft_vocab_size``,
``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``: taps as inputs of those
layers, ascending) and ``*.safetensors`` with ``fc``, ``midlayer.*`` (or ``layers.0.*``), ``norm``,
``lm_head``, optional ``embed_tokens`` and ``d2t``/``t2d``. This is the inverse of ``export.export_eagle3``
beside it (one layout, read and written here): the draft must already have the checkpoint's shape
(build it with ``Eagle3Config.from_policy(policy, tap_spec=..., draft_vocab_size=...)``); every
mismatch is named before any weight is copied. ``fc``'s column blocks are put back in the draft's tap
order. A checkpoint without ``embed_tokens`` keeps the draft's (initialised from the policy).

``build_eagle3_from_checkpoint(policy, path)`` builds the draft in the checkpoint's shape for a policy
(taps, widths, heads, draft vocabulary and its maps from the checkpoint; the policy's hidden size and
vocabulary must be the ones the draft was trained on) and loads it: the runs' warm start of an
EAGLE-3 draft whose profile spec names a checkpoint (``repro.rl.drafts.build_draft``, through
``repro.core.handoffs``). No vLLM is needed to load.

    from integrations.vllm.load import build_eagle3_from_checkpoint, load_eagle3_checkpoint
    load_eagle3_checkpoint(draft, "/ckpt/Qwen3-8B-EAGLE3")
    draft = build_eagle3_from_checkpoint(policy, "/ckpt/Qwen3-8B-EAGLE3", ttt_steps=3)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from integrations.vllm.export import EAGLE3_LAYER_PARAMS, eagle3_own_name, tap_order


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


def _expect(what: str, got, want, have: str = "the draft was built with") -> None:
    if got != want:
        raise ValueError(f"EAGLE-3 checkpoint {what} is {got!r}, but {have} {want!r}")


def _read_config(root: Path) -> dict:
    if not root.is_dir():
        raise FileNotFoundError(f"EAGLE-3 checkpoint folder {root} does not exist")
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"EAGLE-3 checkpoint folder {root} has no config.json")
    return json.loads((root / "config.json").read_text())


def load_eagle3_checkpoint(draft, path: str | Path) -> dict:
    """Copy the checkpoint at ``path`` into ``draft`` (an ``Eagle3Draft``); returns the checkpoint's config."""
    from repro.models.eagle3 import Eagle3Draft
    if not isinstance(draft, Eagle3Draft):
        raise TypeError(f"load_eagle3_checkpoint needs an Eagle3Draft, got {type(draft).__name__}")
    root = Path(path)
    cfg = _read_config(root)
    _load_into(draft, root, cfg, _read_tensors(root))
    return cfg


def _load_into(draft, root: Path, cfg: dict, t: dict[str, torch.Tensor]) -> None:
    """Check ``cfg`` and the tensors ``t`` against ``draft``'s shape, then copy them in (nothing on a mismatch)."""
    c = draft.cfg
    _expect("hidden_size", cfg.get("hidden_size"), c.hidden_size)
    _expect("num_attention_heads", cfg.get("num_attention_heads"), c.num_heads)
    _expect("num_key_value_heads", cfg.get("num_key_value_heads"), c.num_kv_heads)
    _expect("target_hidden_size", cfg.get("target_hidden_size", cfg.get("hidden_size")), c.target_hidden)
    _expect("draft_vocab_size", cfg.get("draft_vocab_size", cfg.get("vocab_size")), c.draft_vocab_size)
    ascending, order = tap_order(draft)
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        _expect("eagle_aux_hidden_state_layer_ids (taps, input of layer, ascending)", list(aux), ascending)
    prefix = "midlayer." if any(k.startswith("midlayer.") for k in t) else "layers.0."

    def take(name: str) -> torch.Tensor:
        if name not in t:
            raise KeyError(f"EAGLE-3 checkpoint {root} lacks weight {name!r} (has {sorted(t)[:8]}...)")
        return t[name]

    th = c.target_hidden
    fc = take("fc.weight")
    _expect("fc.weight shape", tuple(fc.shape), tuple(draft.fc.weight.shape))
    blocks = [fc[:, j * th:(j + 1) * th] for j in range(len(order))]         # ascending tap order
    fc_ours = torch.empty_like(fc)
    for j, i in enumerate(order):                                            # block j belongs to tap i
        fc_ours[:, i * th:(i + 1) * th] = blocks[j]
    src = {"fc.weight": fc_ours, "norm.weight": take("norm.weight"), "lm_head.weight": take("lm_head.weight")}
    for p in EAGLE3_LAYER_PARAMS:
        src[eagle3_own_name(p)] = take(f"{prefix}{p}.weight")
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


def build_eagle3_from_checkpoint(policy, path: str | Path, **train_options):
    """An ``Eagle3Draft`` for ``policy`` in the shape of the checkpoint at ``path``, its weights loaded.

    The shape comes from the checkpoint's ``config.json`` (width, heads, head_dim, MLP width, draft
    vocabulary, RoPE base, norm eps, ``eagle_aux_hidden_state_layer_ids``, else the EAGLE-3 default taps
    as vLLM assumes them) and its ``d2t``/``t2d`` maps; ``train_options`` are the training-only
    ``Eagle3Config`` fields (``ttt_steps``, ``decay``, ``pass_weights``). The policy must match what the
    draft was trained on (``target_hidden_size``, ``vocab_size``); every mismatch raises ValueError and a
    missing folder, config.json or weights file FileNotFoundError, before any weight is copied. The
    embedding (and, when the checkpoint lacks one, ``embed_tokens``) starts from the policy's.
    """
    from repro.models.eagle3 import Eagle3Config, Eagle3Draft
    from repro.models.taps import TapSpec
    from repro.models.vocab import full_draft_vocab
    root = Path(path)
    cfg = _read_config(root)
    t = _read_tensors(root)
    pc = policy.config
    _expect("target_hidden_size", cfg.get("target_hidden_size", cfg.get("hidden_size")), policy.hidden_size,
            "the policy's hidden size is")
    n_layers = policy.num_layers
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is None:
        taps = TapSpec.eagle3_default(n_layers)
    elif min(aux) >= 1:                           # input of layer l == output of layer l-1
        taps = TapSpec(tuple(int(a) - 1 for a in aux), "output", n_layers)
    else:                                         # the embedding is a tap: keep vLLM's input convention
        taps = TapSpec(tuple(int(a) for a in aux), "input", n_layers)
    heads = int(cfg.get("num_attention_heads", pc.num_attention_heads))
    hidden = int(cfg.get("hidden_size", policy.hidden_size))
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
    draft_vocab = int(cfg.get("draft_vocab_size") or cfg.get("vocab_size") or policy.vocab_size)
    if "draft_vocab_size" in cfg and cfg.get("vocab_size") is not None:   # then vocab_size is the target's
        _expect("vocab_size", cfg["vocab_size"], policy.vocab_size, "the policy's vocabulary size is")
    if "d2t" in t:
        d2t = t["d2t"].long()
        ids = torch.arange(d2t.numel()) + d2t     # the target ids of the draft vocabulary
        if d2t.numel() != draft_vocab or ids.min() < 0 or ids.max() >= policy.vocab_size:
            raise ValueError(f"EAGLE-3 checkpoint {root}: d2t ({d2t.numel()} entries) does not map a draft "
                             f"vocabulary of {draft_vocab} into the policy's {policy.vocab_size} token ids")
        t2d = (t["t2d"].bool() if "t2d" in t
               else torch.zeros(policy.vocab_size, dtype=torch.bool).index_fill_(0, ids, True))
    elif draft_vocab == policy.vocab_size:
        d2t, t2d = full_draft_vocab(policy.vocab_size)
    else:
        raise ValueError(f"EAGLE-3 checkpoint {root} has draft_vocab_size {draft_vocab} < the policy's vocabulary "
                         f"{policy.vocab_size} but no d2t map")
    c = Eagle3Config(target_hidden=policy.hidden_size, vocab_size=policy.vocab_size, tap_spec=taps,
                     hidden_size=hidden, num_heads=heads,
                     num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                     head_dim=int(cfg.get("head_dim") or hidden // heads),
                     intermediate_size=int(cfg.get("intermediate_size", pc.intermediate_size)),
                     draft_vocab_size=draft_vocab, rope_theta=float(rope or getattr(pc, "rope_theta", None) or 1e4),
                     rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), **train_options)
    draft = Eagle3Draft(c, d2t, t2d)
    draft.init_from_policy(policy)
    _load_into(draft, root, cfg, t)
    return draft
