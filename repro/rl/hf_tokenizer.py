"""A checkpoint's own tokenizer behind the interface the workloads use (``WorkloadTokenizer``'s).

The suite's episodes, tasks, trainer and drafts use ``encode``/``decode``, ``vocab_size`` and one token
id per role: padding, end of sequence, the block drafts' mask token, the chat roles and the tool-call
delimiters (``ROLES``). With a real checkpoint (a paper profile run with ``--engine suite``) those come
from the checkpoint's tokenizer (``AutoTokenizer``, local files only), each role named by the profile's
``rl.policies.<name>.tokens`` as a token string that is one id in that tokenizer, or as an id. ``pad``,
``eos`` and ``mask`` fall back to the tokenizer's own pad/eos/mask tokens. The mask token is needed by
block drafts only (DFlash, DSpark); a missing one is an error naming the role to set.

Prompts keep the suite's single-token role layout (``[user] text [assistant]``), not the checkpoint's
chat template. ``vocab_size`` is the checkpoint's embedding rows (config.json), which may exceed the
tokenizer's length (Qwen3: 151,936 rows, 151,669 tokens).

    tok = tokenizer_for_run(cfg, out="/tmp/run", seed=0)     # checkpoint policy: CheckpointTokenizer
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from repro.core.specs import ConfigError, read_checkpoint_config
from repro.rl.config import RunConfig

ROLES = ("pad", "eos", "mask", "user", "assistant", "call", "call_end", "obs", "obs_end")
FALLBACK_ATTR = {"pad": "pad_token_id", "eos": "eos_token_id", "mask": "mask_token_id"}
BLOCK_DRAFTS = ("dflash", "dspark")


class CheckpointTokenizer:
    """An HF tokenizer with the suite's role ids (``pad_id``, ``eos_id``, ``mask_id``, ``user_id``, ...)."""

    def __init__(self, hf_tok, vocab_size: int, tokens: Mapping[str, Any] | None = None, *,
                 need_mask: bool = False, where: str = "checkpoint tokenizer"):
        self.hf = hf_tok
        self._vocab_size = int(vocab_size)
        tokens = dict(tokens or {})
        unknown = sorted(set(tokens) - set(ROLES))
        if unknown:
            raise ConfigError(f"config policy.tokens has unknown roles {unknown}: expected roles among {list(ROLES)}")
        if len(hf_tok) > self._vocab_size:
            raise ConfigError(f"{where} has {len(hf_tok)} tokens, more than the checkpoint's vocab_size "
                              f"{self._vocab_size} (config.json)")
        ids = {}
        for role in ROLES:
            ids[role] = self._resolve(role, tokens.get(role), where)
        if ids["mask"] is None and need_mask:
            raise ConfigError(f"{where} has no mask token, which block drafts ({', '.join(BLOCK_DRAFTS)}) need: "
                              "set policy tokens.mask (rl.policies.<name>.tokens.mask) to a token of the "
                              "tokenizer or an unused embedding id < vocab_size (e.g. the draft checkpoint's "
                              "mask_token_id)")
        self.ids = ids
        self.pad_id, self.eos_id, self.mask_id = ids["pad"], ids["eos"], ids["mask"]
        self.user_id, self.assistant_id = ids["user"], ids["assistant"]
        self.call_id, self.call_end_id, self.obs_id, self.obs_end_id = (ids["call"], ids["call_end"], ids["obs"],
                                                                        ids["obs_end"])

    def _resolve(self, role: str, value: Any, where: str) -> int | None:
        if value is None:
            fallback = getattr(self.hf, FALLBACK_ATTR[role], None) if role in FALLBACK_ATTR else None
            if fallback is None and role != "mask":
                raise ConfigError(f"{where} has no {role} token: set policy tokens.{role} "
                                  f"(rl.policies.<name>.tokens.{role}) to one of its tokens or an id")
            return fallback
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"config policy.tokens.{role}={value!r} is invalid: expected a token string or an id")
        if isinstance(value, int):
            if not 0 <= value < self._vocab_size:
                raise ConfigError(f"config policy.tokens.{role}={value} is invalid: expected an id in "
                                  f"[0, {self._vocab_size})")
            return value
        got = self.hf.convert_tokens_to_ids(value)
        if got is None or got == self.hf.unk_token_id or self.hf.convert_ids_to_tokens(got) != value:
            raise ConfigError(f"config policy.tokens.{role}={value!r} is invalid: {where} has no such token "
                              "(expected one token of its vocabulary, e.g. an added special token)")
        return int(got)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        n = len(self.hf)     # ids past the tokenizer (unused embedding rows, e.g. a mask id) decode to nothing
        return self.hf.decode([i for i in ids if i < n], skip_special_tokens=skip_special)

    @classmethod
    def load(cls, path: str | Path, tokens: Mapping[str, Any] | None = None, *, vocab_size: int | None = None,
             need_mask: bool = False) -> CheckpointTokenizer:
        from transformers import AutoTokenizer
        path = Path(path)
        try:
            hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise FileNotFoundError(f"no tokenizer in checkpoint folder {path} (expected tokenizer.json / "
                                    f"tokenizer_config.json): {exc}") from exc
        if vocab_size is None:
            vocab_size = int(read_checkpoint_config(path)["vocab_size"])
        return cls(hf, vocab_size, tokens, need_mask=need_mask, where=f"tokenizer of checkpoint {path}")


def tokenizer_for_run(cfg: RunConfig, *, out: str | Path, seed: int, warm_start: str | Path = ""):
    """The run's tokenizer: the checkpoint's for a checkpoint policy, else the suite's workload tokenizer
    (from the warm start, or trained and cached in ``<out>/tokenizer``)."""
    if cfg.policy.checkpoint:
        need_mask = cfg.draft is not None and cfg.draft.family in BLOCK_DRAFTS
        return CheckpointTokenizer.load(cfg.policy.path, cfg.policy.tokens, vocab_size=cfg.vocab_size,
                                        need_mask=need_mask)
    from repro.rl.tokenizer import WorkloadTokenizer, build_workload_tokenizer
    if warm_start:
        return WorkloadTokenizer.load(Path(warm_start) / "tokenizer")
    return build_workload_tokenizer(Path(out) / "tokenizer", cfg.vocab_size, seed)
