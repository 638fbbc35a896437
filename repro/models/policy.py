"""The policy: a real transformers causal LM (Qwen3, Qwen3-MoE, Llama, GPT-OSS) with taps and a ragged KV cache.

Three ways to get one, all returning a ``Policy``:

* ``build_policy(family, "tiny")``: a tiny random-initialised config that runs on a CPU in the tests;
* ``build_policy(family, "gpu")``: a few-hundred-million-parameter random config for one GPU;
* ``load_policy(path)``: a real checkpoint from a local folder (paper scale), e.g. Qwen3-8B.

``Policy.forward_train`` runs a whole packed or padded batch (no cache) and returns logits plus the
taps named by its ``TapSpec``; ``Policy.decode_step`` runs a few new tokens per row against an HF
``DynamicCache`` whose slots are described by a ``repro.decoding.kv.SlotTable`` (ragged acceptance).
Attention masks are passed to the HF model pre-built, so every family sees the same rule.

    python -m repro.models.policy --family qwen3 --scale gpu     # print the config and parameter count
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repro.decoding.kv import SlotTable
from repro.decoding.policy_cache import SharedKVStorage, StaticPolicyCache
from repro.models.moe_experts import use_autocast_experts
from repro.models.policy_attention import grouped_attention
from repro.models.taps import TapRecorder, TapSpec

FAMILIES = ("qwen3", "qwen3_moe", "llama", "gpt_oss")
SCALES = ("tiny", "gpu")


def _classes(family: str):
    import transformers as tf
    table = {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    }
    if family not in table:
        raise ValueError(f"policy family {family!r} is not one of {FAMILIES}")
    cfg_name, model_name = table[family]
    if not hasattr(tf, model_name):
        raise ImportError(f"transformers {tf.__version__} has no {model_name}; family {family!r} "
                          "needs a newer transformers")
    return getattr(tf, cfg_name), getattr(tf, model_name)


def policy_config(family: str, scale: str, *, vocab_size: int | None = None, **overrides: Any):
    """The HF config of a random-initialised policy at ``scale`` (``tiny`` for CPU, ``gpu`` for one GPU)."""
    if scale not in SCALES:
        raise ValueError(f"policy scale {scale!r} is not one of {SCALES} (real checkpoints: load_policy)")
    cfg_cls, _ = _classes(family)
    if scale == "tiny":
        base = {"vocab_size": vocab_size or 128, "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "max_position_embeddings": 1024, "rope_theta": 1e4, "tie_word_embeddings": False}
    else:  # ~0.4B parameters with a 32K vocabulary: Qwen3-0.6B's shape, 24 layers
        base = {"vocab_size": vocab_size or 32000, "hidden_size": 1024, "intermediate_size": 3072,
                    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                    "max_position_embeddings": 8192, "rope_theta": 1e6, "tie_word_embeddings": False}
    if family == "qwen3_moe":
        base.update(num_experts=4 if scale == "tiny" else 16, num_experts_per_tok=2,
                    moe_intermediate_size=base["intermediate_size"] // 2, decoder_sparse_step=1,
                    mlp_only_layers=[], norm_topk_prob=True)
    if family == "gpt_oss":
        base.update(num_local_experts=4 if scale == "tiny" else 16, num_experts_per_tok=2,
                    sliding_window=16 if scale == "tiny" else 128, max_position_embeddings=131072,
                    layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                 for i in range(base["num_hidden_layers"])])
    # random policies have no tokenizer: no special tokens (the engine's stop_tokens say when to stop)
    base.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base.update(overrides)
    return cfg_cls(**base)


def build_policy(family: str, scale: str = "tiny", *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", init_std: float | None = None,
                 tap_spec: TapSpec | None = None, **config_overrides: Any) -> Policy:
    """A random-initialised policy of ``family`` at ``scale`` (seeded; same seed, same weights)."""
    _, model_cls = _classes(family)
    cfg = policy_config(family, scale, **config_overrides)
    if init_std is not None:
        cfg.initializer_range = init_std
    attn = "eager" if family == "gpt_oss" else "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
        model = model_cls._from_config(cfg, attn_implementation=attn, dtype=dtype, **extra)
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = None
    use_autocast_experts(model)          # MoE: grouped GEMMs in the autocast dtype under the update's autocast
    return Policy(model.to(device=device, dtype=dtype).eval(), family=family, tap_spec=tap_spec)


def load_policy(path: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16,
                device: str | torch.device = "cpu", tap_spec: TapSpec | None = None) -> Policy:
    """A real checkpoint (HF folder with config.json and weights) from a local ``path``."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"policy checkpoint {str(p)!r} not found: expected a local HF folder with "
                                "config.json and *.safetensors (download it first; nothing is fetched)")
    from transformers import AutoConfig, AutoModelForCausalLM
    model_type = AutoConfig.from_pretrained(p).model_type     # any HF causal LM; FAMILIES are the tested ones
    model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, attn_implementation="sdpa"
                                                 if model_type != "gpt_oss" else "eager")
    use_autocast_experts(model)
    return Policy(model.to(device).eval(), family=model_type, tap_spec=tap_spec)


@dataclass
class StepOutput:
    logits: torch.Tensor             # [B, q, V]
    taps: list[torch.Tensor] | None  # per tap [B, q, H], detached


class Policy(nn.Module):
    """An HF causal LM plus its tap hooks and the ragged-cache decode step used by the rollout engine."""

    def __init__(self, model: nn.Module, *, family: str, tap_spec: TapSpec | None = None):
        super().__init__()
        self.model = model
        self.family = family
        cfg = model.config
        self.config = cfg
        self.num_layers = int(cfg.num_hidden_layers)
        self.vocab_size = int(cfg.vocab_size)
        self.hidden_size = int(cfg.hidden_size)
        layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * self.num_layers)
        self._layer_types = sorted(set(layer_types))
        self._window = getattr(cfg, "sliding_window", None)
        # transformers 5.24 renamed forward(past_key_values=) to cache=; older 5.x only knows the former
        params = inspect.signature(model.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.recorder: TapRecorder | None = None
        if tap_spec is not None:
            self.set_taps(tap_spec)

    # -- taps ----------------------------------------------------------------------------------------
    def decoder_layers(self) -> nn.ModuleList:
        return self.model.model.layers

    def set_taps(self, spec: TapSpec) -> None:
        if spec.num_layers != self.num_layers:
            raise ValueError(f"TapSpec is for a {spec.num_layers}-layer policy, this one has {self.num_layers}")
        if self.recorder is not None:
            self.recorder.remove()
        self.recorder = TapRecorder(self.decoder_layers(), spec)

    @property
    def has_experts(self) -> bool:
        """Whether the decoder layers route tokens to experts (the MoE families)."""
        return bool(getattr(self.config, "num_experts", 0) or getattr(self.config, "num_local_experts", 0))

    @property
    def tap_spec(self) -> TapSpec | None:
        return self.recorder.spec if self.recorder is not None else None

    # -- shared parts the block drafts ride on -----------------------------------------------------------
    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- forwards ------------------------------------------------------------------------------------
    def _run(self, input_ids, mask, position_ids, cache, want_taps: bool, inline: bool = False,
             static: StaticPolicyCache | None = None, last_logits: bool = False) -> StepOutput:
        kwargs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids, "use_cache": cache
                      is not None}
        if last_logits:
            kwargs["logits_to_keep"] = 1
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        if want_taps and self.recorder is None:
            raise RuntimeError("taps requested but the policy has no TapSpec (call set_taps)")
        # steps on a cache attend with grouped queries (repro.models.policy_attention), which also writes a static
        # cache's layers; training forwards as built
        with (self.recorder.capture() if want_taps else contextlib.nullcontext()) as taps, \
                (grouped_attention(self.model, inline, static) if cache is not None
                 else contextlib.nullcontext()) as extra:
            out = self.model(**kwargs, **(extra or {}))
        return StepOutput(out.logits, taps)

    def _windows(self) -> dict[str, int | None]:
        return {t: (self._window if t == "sliding_attention" else None) for t in self._layer_types}

    def _mask_arg(self, masks: dict[str, torch.Tensor]):
        # one layer type: a bare 4D mask (families whose model has no per-type mask mapping take only that)
        return masks if len(masks) > 1 or self.family == "gpt_oss" else masks[self._layer_types[0]]

    def _masks(self, table: SlotTable, q_pos: torch.Tensor):
        dtype = self.dtype
        return self._mask_arg({t: table.additive_mask(q_pos, dtype, w) for t, w in self._windows().items()})

    @torch.no_grad()
    def decode_step(self, input_ids: torch.Tensor, positions: torch.Tensor, cache, table: SlotTable,
                    live: torch.Tensor | None = None, want_taps: bool = False) -> StepOutput:
        """Run ``input_ids [B, q]`` at ``positions [B, q]``, appending q slots to ``cache`` and ``table``."""
        table.append(positions, live)
        q_pos = positions.to(table.pos.device)
        return self._run(input_ids, self._masks(table, q_pos), positions, cache, want_taps)

    @torch.no_grad()
    def decode_step_static(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: StaticPolicyCache,
                           live: torch.Tensor | None = None, want_taps: bool = False,
                           cursor: torch.Tensor | None = None, view: int | None = None,
                           last_logits: bool = False, row_cols: torch.Tensor | None = None) -> StepOutput:
        """Run ``input_ids [B, q]`` at ``positions [B, q]`` on a static cache, writing the q columns at ``cursor``
        (a device scalar from ``cache.reserve``; None: reserve them here), or each row's own ``row_cols [B, q]``
        (its frontier: ``StaticPolicyCache.begin``), and attending over the first ``view`` columns
        (``cache.used_view()``); ``last_logits``: the logits of the last column only (``[B, 1, V]``, a prefill's).
        Device work only: capturable."""
        cache.begin(positions, live, cursor, view, row_cols=row_cols)
        masks = cache.additive_masks(positions, self._windows())
        return self._run(input_ids, self._mask_arg(masks), positions, cache.hf, want_taps, cache.in_graph, cache,
                         last_logits=last_logits)

    def new_static_cache(self, batch: int, max_slots: int, storage: SharedKVStorage | None = None
                         ) -> StaticPolicyCache:
        """A static KV cache of ``max_slots`` columns for ``batch`` rows, in this policy's dtype and device (its
        buffers on ``storage``'s memory when given: repro.decoding.policy_cache.SharedKVStorage)."""
        cfg = self.config
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or self.hidden_size // heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        return StaticPolicyCache(batch, max_slots, num_layers=self.num_layers, kv_heads=kv_heads, head_dim=head_dim,
                                 dtype=self.dtype, device=self.device, storage=storage)

    def forward_train(self, input_ids: torch.Tensor, want_taps: bool = True,
                      attention_mask: torch.Tensor | None = None) -> StepOutput:
        """A full forward over ``input_ids [B, T]`` (right padding given by ``attention_mask``), no cache.

        HF builds the causal (and padding, sliding-window) masks itself here, so long training
        sequences take its efficient path instead of a dense ``[T, T]`` mask.
        """
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device).expand(B, T)
        mask = attention_mask.long() if attention_mask is not None else None
        return self._run(input_ids, mask, pos, None, want_taps)

    def new_cache(self):
        from transformers import DynamicCache
        return DynamicCache()  # full layers only: sliding windows are applied by our masks

    def copy_as(self, dtype: torch.dtype) -> Policy:
        """A deep copy in ``dtype`` with its own tap hooks (this policy's hooks are not copied)."""
        spec = self.tap_spec
        if self.recorder is not None:
            self.recorder.remove()
            self.recorder = None
        try:
            model = copy.deepcopy(self.model).to(dtype)
        finally:
            if spec is not None:
                self.set_taps(spec)
        return Policy(model, family=self.family, tap_spec=spec)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=FAMILIES, default="qwen3")
    ap.add_argument("--scale", choices=SCALES, default="tiny")
    args = ap.parse_args(argv)
    cfg = policy_config(args.family, args.scale)
    _, model_cls = _classes(args.family)
    with torch.device("meta"):
        n = sum(p.numel() for p in model_cls(cfg).parameters())
    print(cfg)
    print(f"{args.family}/{args.scale}: {n / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
