"""EAGLE-3: fused low/mid/high taps, one decoder layer on [embedding ; feature], reduced vocabulary, TTT.

Architecture (shared/reference/draft_families.md section 1): ``g = fc(cat(taps))``; one Llama-style
layer whose q/k/v read ``[input_layernorm(e) ; hidden_norm(g)]`` (2H wide) with the un-normalised
``g`` as residual; ``lm_head(norm(.))`` over a reduced draft vocabulary (``d2t``/``t2d``).

Training (training-time test, K passes): pass k embeds the tokens shifted left by k+1, feeds back the
draft's own hidden state of pass k-1 at the same index, applies RoPE at position + k, and attends
through ``kernels.attention.eagle3_ttt_attention`` (query i sees pass-0 keys j <= i and its own keys
of passes 1..k). Pass k at index i is trained with soft cross-entropy against the policy's
distribution at i+k+1 (renormalised over the draft vocabulary), masked by ``loss_mask[i+k+1]`` and by
whether the policy's argmax is in the draft vocabulary; pass weights are ``pass_weights`` or
``decay**k``.

Under context parallelism (``ttt_loss(..., cp=PackedShard)``) the taps and the policy's logits are one
rank's zigzag rows of the packed batch, the attention is the CP group's ring, the teacher rows of
shifted positions held by other ranks are fetched, and the loss is the rank's share of the total.

Inference (``Eagle3Proposer``): the pairs (h_j, x_{j+1}) of committed tokens are ingested as pass-0
keys; k chain proposals take one draft forward each (the ingest forward yields the first).

    draft = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=3))
    loss, per_pass = draft.ttt_loss(input_ids, taps, policy_logits, loss_mask)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention import dense_attention, eagle3_ttt_attention, eagle3_ttt_mask
from kernels.attention.padded_ttt import padded_ttt_attention, padded_ttt_mask
from repro.decoding.kv import SlotTable
from repro.decoding.sampling import probs_from_logits, proposal_noise, sample_with_noise
from repro.decoding.static_kv import StaticKV, StaticProposerState
from repro.models.draft_layers import (
    DraftKV,
    RMSNorm,
    Rotary,
    SwiGLU,
    batch_to_packed,
    cache_attention,
    row_cu_seqlens,
    row_layout,
)
from repro.models.taps import TapSpec, TapSpecFromConfig
from repro.models.vocab import check_vocab_maps, draft_to_target_ids, full_draft_vocab
from repro.parallel.cp_batch import PackedShard

ATTN_IMPLS = ("kernels", "dense", "padded")


@dataclass
class Eagle3Config:
    target_hidden: int
    vocab_size: int
    tap_spec: TapSpec
    hidden_size: int = 0
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 0
    draft_vocab_size: int = 0          # 0: the full target vocabulary
    ttt_steps: int = 3
    pass_weights: tuple[float, ...] | None = None
    decay: float = 0.8
    rope_theta: float = 1e4
    rms_eps: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hidden_size = self.hidden_size or self.target_hidden
        self.intermediate_size = self.intermediate_size or 2 * self.hidden_size
        self.draft_vocab_size = self.draft_vocab_size or self.vocab_size
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.pass_weights is not None and len(self.pass_weights) != self.ttt_steps:
            raise ValueError(f"pass_weights has {len(self.pass_weights)} entries, expected ttt_steps="
                             f"{self.ttt_steps}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @classmethod
    def from_policy(cls, policy, tap_spec: TapSpec | None = None, **kw) -> Eagle3Config:
        c = policy.config
        kw.setdefault("num_heads", c.num_attention_heads)
        kw.setdefault("num_kv_heads", c.num_key_value_heads)
        kw.setdefault("head_dim", getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        kw.setdefault("intermediate_size", c.intermediate_size)
        kw.setdefault("rope_theta", float(getattr(c, "rope_theta", None) or 1e4))
        return cls(target_hidden=policy.hidden_size, vocab_size=policy.vocab_size,
                   tap_spec=tap_spec or TapSpec.eagle3_default(policy.num_layers), **kw)

    def weights(self) -> list[float]:
        return list(self.pass_weights) if self.pass_weights is not None else [self.decay ** k for k in
                                                                               range(self.ttt_steps)]


class Eagle3Draft(TapSpecFromConfig, nn.Module):
    """The EAGLE-3 draft model; satisfies ``repro.parallel.draft_interface.TapDraft``."""

    def __init__(self, cfg: Eagle3Config, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        H, nh, g, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        n_taps = len(cfg.tap_spec.layers)
        if d2t is None and t2d is None:
            if cfg.draft_vocab_size != cfg.vocab_size:
                raise ValueError(f"draft_vocab_size={cfg.draft_vocab_size} < vocab_size={cfg.vocab_size} needs "
                                 "d2t/t2d maps (repro.models.vocab.build_draft_vocab)")
            d2t, t2d = full_draft_vocab(cfg.vocab_size)
        elif d2t is None or t2d is None:
            raise ValueError("give both d2t and t2d, or neither")
        check_vocab_maps(d2t, t2d, cfg.vocab_size)
        if d2t.numel() != cfg.draft_vocab_size:
            raise ValueError(f"vocabulary maps disagree with the config: d2t has {d2t.numel()} entries, "
                             f"draft_vocab_size={cfg.draft_vocab_size}")
        self.register_buffer("d2t", d2t.long().clone())
        self.register_buffer("t2d", t2d.bool().clone())
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)       # loaded from the policy, frozen
        self.fc = nn.Linear(n_taps * cfg.target_hidden, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, g * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, g * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_eps)
        self.mlp = SwiGLU(H, cfg.intermediate_size)
        self.norm = RMSNorm(H, cfg.rms_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.rope = Rotary(hd, cfg.rope_theta)
        self.attn_backend = "auto"        # kernels.attention backend used by draft_loss

    # -- TapDraft contract -------------------------------------------------------------------------------
    def draft_loss(self, features, batch) -> torch.Tensor:
        """The TTT loss of one microbatch; with ``batch.extras["cp"]`` (a ``PackedShard``) the features and
        the policy's logits are this CP rank's rows and the loss is this rank's share of the total."""
        if batch.policy_logits is None:
            raise ValueError("EAGLE-3's loss needs the policy's logits (DraftBatch.policy_logits)")
        cp = batch.extras.get("cp") if hasattr(batch.extras, "get") else None
        return self.ttt_loss(batch.input_ids, features.concat(self.tap_layers), batch.policy_logits,
                             batch.loss_mask, backend=self.attn_backend, cp=cp)[0]

    @torch.no_grad()
    def init_from_policy(self, policy) -> None:
        """Copy the policy's embedding, and its head rows of the draft vocabulary (NeMo-RL's init)."""
        self.embed_tokens.weight.copy_(policy.embed_tokens.weight)
        if self.cfg.hidden_size == policy.hidden_size:
            self.lm_head.weight.copy_(policy.lm_head.weight[draft_to_target_ids(self.d2t)])

    # -- pieces ------------------------------------------------------------------------------------------
    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        want = len(self.cfg.tap_spec.layers) * self.cfg.target_hidden
        if taps.shape[-1] != want:
            raise ValueError(f"fused taps have {taps.shape[-1]} features, expected {want} "
                             f"({len(self.cfg.tap_spec.layers)} taps x hidden {self.cfg.target_hidden})")
        return self.fc(taps if taps.dtype == self.fc.weight.dtype else taps.to(self.fc.weight.dtype))

    def qkv(self, e: torch.Tensor, g: torch.Tensor, positions: torch.Tensor):
        """q/k/v ``[..., T, heads, D]`` of embeddings ``e`` and hidden ``g`` at RoPE ``positions``."""
        c = self.cfg
        x = torch.cat([self.input_layernorm(e), self.hidden_norm(g)], dim=-1)
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(*lead, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(*lead, c.num_kv_heads, c.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def finish(self, g: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        g = g + self.o_proj(attn.flatten(-2))
        return g + self.mlp(self.post_attention_layernorm(g))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(g))

    # -- training ----------------------------------------------------------------------------------------
    def ttt_forward(self, input_ids: torch.Tensor, taps: torch.Tensor, attn_impl: str = "kernels",
                    backend: str = "auto", cp: PackedShard | None = None) -> list[torch.Tensor]:
        """Logits ``[B, S, V_draft]`` of each TTT pass over a right-padded batch ``input_ids [B, S]``.

        With ``cp`` (this rank's ``PackedShard`` of the batch) ``taps`` are the rank's rows ``[T_local, F]``
        and so are the logits ``[T_local, V_draft]``; attention runs on the CP group's zigzag ring."""
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl {attn_impl!r} is not one of {ATTN_IMPLS}")
        B, S = input_ids.shape
        dev = input_ids.device
        if attn_impl == "padded":
            if cp is not None:
                raise ValueError("attn_impl 'padded' has no CP path: expected 'kernels' with a PackedShard")
            return self._ttt_forward_padded(input_ids, taps)
        group = None
        if cp is None:
            if taps.shape[:2] != (B, S):
                raise ValueError(f"taps are {tuple(taps.shape[:2])}, expected [batch, seq] = {(B, S)}")
            cu = row_cu_seqlens(B, S, dev) if attn_impl == "dense" else row_layout(B, S)
            pos = torch.arange(S, device=dev).repeat(B)                 # [T]
            g = batch_to_packed(self.fuse(taps))                         # [T, H]
        else:
            taps = _cp_rows(cp, input_ids, taps, "taps")
            if attn_impl != "kernels":
                raise ValueError(f"attn_impl {attn_impl!r} has no CP path: expected 'kernels' with a PackedShard")
            cu, group, pos = cp.layout, cp.group, cp.position_ids.to(dev)
            g = self.fuse(taps)                                          # [T_local, H]
        ks, vs, out = [], [], []
        scale = self.cfg.head_dim ** -0.5
        for k in range(self.cfg.ttt_steps):
            if cp is None:
                ids = F.pad(input_ids[:, k + 1:], (0, k + 1))           # x_{i+k+1}, zero past the end
                e = batch_to_packed(self.embed_tokens(ids)).to(g.dtype)
            else:
                e = self.embed_tokens(cp.local(input_ids, k + 1)).to(g.dtype)
            q, kk, v = self.qkv(e, g, pos + k)
            ks.append(kk)
            vs.append(v)
            if attn_impl == "kernels":
                a = eagle3_ttt_attention(q, ks, vs, cu, group, backend=backend)
            else:
                mask = eagle3_ttt_mask(cu.cpu(), k).to(dev)
                a, _ = dense_attention(q, torch.cat(ks), torch.cat(vs), mask, scale)
            g = self.finish(g, a)
            out.append(self.logits(g).view(B, S, -1) if cp is None else self.logits(g))
        return out

    def _ttt_forward_padded(self, input_ids: torch.Tensor, taps: torch.Tensor) -> list[torch.Tensor]:
        """``ttt_forward`` of a right-padded batch with each pass's attention one masked SDPA over its rows
        (kernels.attention.padded_ttt): no host work, so the RL update's training step can replay as a CUDA
        graph (repro.rl.draft_graph)."""
        B, S = input_ids.shape
        if taps.shape[:2] != (B, S):
            raise ValueError(f"taps are {tuple(taps.shape[:2])}, expected [batch, seq] = {(B, S)}")
        pos = torch.arange(S, device=input_ids.device)
        mask = [padded_ttt_mask(S, k, input_ids.device) for k in range(self.cfg.ttt_steps)]
        g = self.fuse(taps)                                              # [B, S, H]
        ks, vs, out = [], [], []
        for k in range(self.cfg.ttt_steps):
            e = self.embed_tokens(F.pad(input_ids[:, k + 1:], (0, k + 1))).to(g.dtype)   # x_{i+k+1}
            q, kk, v = self.qkv(e, g, pos + k)
            ks.append(kk)
            vs.append(v)
            g = self.finish(g, padded_ttt_attention(q, ks, vs, mask=mask[k]))
            out.append(self.logits(g))
        return out

    def _draft_vocab_probs(self, teacher: torch.Tensor) -> torch.Tensor:
        """The teacher's softmax over the draft vocabulary's columns, taken by index rather than by the bool mask
        ``t2d`` (same columns, same order; no host sync, so CUDA-graph safe)."""
        return torch.softmax(teacher.index_select(-1, draft_to_target_ids(self.d2t)), dim=-1)

    def ttt_loss(self, input_ids, taps, policy_logits, loss_mask, attn_impl: str = "kernels",
                 backend: str = "auto", cp: PackedShard | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Weighted sum over passes of the masked soft cross-entropy; also returns the per-pass losses.

        With ``cp``, ``taps`` and ``policy_logits`` are this rank's rows and the losses are this rank's
        shares (numerators over the group-wide normalisers): summed over the group they are the loss."""
        if cp is not None:
            return self._ttt_loss_cp(input_ids, taps, policy_logits, loss_mask, backend, cp)
        B, S = input_ids.shape
        if policy_logits.shape[:2] != (B, S) or policy_logits.shape[-1] != self.cfg.vocab_size:
            raise ValueError(f"policy_logits are {tuple(policy_logits.shape)}, expected "
                             f"{(B, S, self.cfg.vocab_size)}")
        acc = torch.promote_types(policy_logits.dtype, torch.float32)     # fp32, or fp64 in the oracle
        teacher = policy_logits.detach().to(acc)
        target_p = self._draft_vocab_probs(teacher)                                     # [B, S, Vd]
        in_vocab = self.t2d[teacher.argmax(-1)].float()
        mask = loss_mask.float() * in_vocab
        per_pass = []
        total = torch.zeros((), dtype=acc, device=input_ids.device)
        for k, (logits, w) in enumerate(zip(self.ttt_forward(input_ids, taps, attn_impl, backend),
                                            self.cfg.weights())):
            sh = k + 1
            tp = F.pad(target_p[:, sh:], (0, 0, 0, sh), value=1.0 / target_p.shape[-1])
            m = F.pad(mask[:, sh:], (0, sh))
            ce = -(tp * torch.log_softmax(logits.to(acc), -1)).sum(-1)
            lk = (ce * m).sum() / m.sum().clamp_min(1.0)
            per_pass.append(lk)
            total = total + w * lk
        return total, per_pass

    def _ttt_loss_cp(self, input_ids, taps, policy_logits, loss_mask, backend, cp: PackedShard):
        T, K = cp.num_local, self.cfg.ttt_steps
        teacher = _cp_rows(cp, input_ids, policy_logits, "policy_logits")
        if teacher.shape[-1] != self.cfg.vocab_size:
            raise ValueError(f"policy_logits have {teacher.shape[-1]} classes, expected {self.cfg.vocab_size}")
        acc = torch.promote_types(teacher.dtype, torch.float32)
        teacher = teacher.detach().to(acc)
        # the teacher of pass k at (b, t) sits at (b, t + k + 1), maybe on another rank: ship the
        # renormalised draft-vocabulary target and the in-vocabulary flag of those rows
        here = torch.cat([self._draft_vocab_probs(teacher),
                          self.t2d[teacher.argmax(-1)].to(acc)[:, None]], dim=-1)
        b = cp.b.repeat(K)
        t = torch.cat([torch.where(cp.real, cp.t + k + 1, cp.t) for k in range(K)])
        there = cp.fetch(here, b, t).view(K, T, -1)
        masks = cp.at(loss_mask.to(acc), b, t).view(K, T).to(there.device) * there[..., -1]
        dens = cp.all_sum(masks.sum(-1))                                      # group-wide, per pass
        per_pass = []
        total = torch.zeros((), dtype=acc, device=input_ids.device)
        for k, (logits, w) in enumerate(zip(self.ttt_forward(input_ids, taps, "kernels", backend, cp),
                                            self.cfg.weights())):
            ce = -(there[k, :, :-1] * torch.log_softmax(logits.to(acc), -1)).sum(-1)
            lk = (ce * masks[k]).sum() / dens[k].clamp_min(1.0)
            per_pass.append(lk)
            total = total + w * lk
        return total, per_pass


def _cp_rows(cp: PackedShard, input_ids: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as this rank's rows ``[T_local, F]`` (accepts a leading microbatch axis of 1)."""
    B, S = input_ids.shape
    if (B, S) != (cp.lengths.numel(), cp.seq_len):
        raise ValueError(f"input_ids are {(B, S)}, but the PackedShard describes a [{cp.lengths.numel()}, "
                         f"{cp.seq_len}] batch")
    x = x.reshape(-1, x.shape[-1])
    if x.shape[0] != cp.num_local:
        raise ValueError(f"{name} have {x.shape[0]} rows, expected this CP rank's {cp.num_local} rows "
                         "(shard them with the PackedShard's layout)")
    return x


class Eagle3Proposer(StaticProposerState):
    """Chain proposals of k tokens from an ``Eagle3Draft`` for ``repro.rollout.engine.RolloutEngine``.

    Two cache modes: ``reset(batch)`` grows a ``SlotTable``/``DraftKV`` cache (trimmed and compacted as it
    goes); ``prepare(batch, max_slots, cuda_graphs=...)`` uses preallocated ``[B, G, S_max, D]`` caches
    whose per-verify-step ``observe`` and ``propose`` have static shapes and run as CUDA graphs on a GPU
    (``repro.decoding.cuda_graph``). Both sample with ``sample_with_noise`` from the same generator draws."""

    def __init__(self, draft: Eagle3Draft, num_proposals: int):
        if num_proposals < 1:
            raise ValueError(f"num_proposals must be >= 1, got {num_proposals}")
        self.draft, self.num_proposals = draft, num_proposals
        self.target_ids = draft_to_target_ids(draft.d2t)
        self.full_vocab = draft.cfg.draft_vocab_size == draft.cfg.vocab_size   # identity maps: no scatter
        self.init_static_state()

    def reset(self, batch: int) -> None:
        dev = self.draft.fc.weight.device
        self.static = False
        self.table = SlotTable(batch, dev)
        self.kv = DraftKV()
        self.trunk_len = 0

    def prepare(self, batch: int, max_slots: int, *, cuda_graphs: bool = False) -> None:
        """Static-cache mode for one request of ``batch`` rows writing at most ``max_slots`` columns."""
        d, c = self.draft, self.draft.cfg
        dev, dt = d.fc.weight.device, d.fc.weight.dtype
        self.prepare_static(batch, max_slots, dt, dev, cuda_graphs=cuda_graphs, name="eagle3", extra=lambda: {
            "skv": StaticKV(batch, c.num_kv_heads, max_slots, c.head_dim, dt, dev),
            "g_last": torch.zeros(batch, c.hidden_size, dtype=dt, device=dev),
            "pos_last": torch.zeros(batch, dtype=torch.long, device=dev)})

    def select(self, rows: torch.Tensor) -> None:
        if self.static:
            self.sb.select(rows)
            return
        self.table.select(rows)
        self.kv.select(rows)
        self.g_last, self.pos_last = self.g_last[rows], self.pos_last[rows]

    def _step(self, e, g, positions, live=None) -> torch.Tensor:
        d = self.draft
        self.table.append(positions, live)
        q, k, v = d.qkv(e, g, positions)
        K, V = self.kv.append(k, v)
        return d.finish(g, cache_attention(q, K, V, self.table.visible(positions), sees_a_key=live is None))

    def _static_step(self, e, g, positions, cursor, live=None) -> torch.Tensor:
        """``_step`` on the static caches: the new slots go to columns ``cursor + j``."""
        d = self.draft
        cols = self.slots.write(cursor, positions, live)
        q, k, v = d.qkv(e, g, positions)
        self.skv.write(cols, k, v)
        # a chain query (live is None) sees its own key, just written; observe's dead columns may see none
        return d.finish(g, cache_attention(q, *self.skv.view(self.slots.view), self.slots.visible(positions),
                                           sees_a_key=live is None))

    @staticmethod
    def _last_live(out, positions, valid):
        cols = torch.arange(valid.shape[1], device=valid.device)
        last = (valid.long() * (cols + 1)).max(1).values - 1          # last live column per row
        rows = torch.arange(valid.shape[0], device=valid.device)
        return out[rows, last], positions[rows, last]

    @torch.no_grad()
    def observe(self, next_tokens, taps, positions, valid) -> None:
        if self.static:    # the next propose's chain keys go to the columns the next observe overwrites
            self.observe_static(next_tokens.shape[1], [("tok", next_tokens, None),
                                                       ("taps", torch.cat(taps, dim=-1), None),
                                                       ("pos", positions, None), ("valid", valid, False)])
            return
        d = self.draft
        self.table.trim(self.trunk_len)                       # drop last round's chain keys
        self.kv.trim(self.trunk_len)
        g = d.fuse(torch.cat(taps, dim=-1))
        e = d.embed_tokens(next_tokens).to(g.dtype)
        out = self._step(e, g, positions, valid)
        tail = self.table.dead_tail()
        if tail:
            self.table.trim(self.table.length - tail)
            self.kv.trim(self.table.length)
        order = self.table.compact(self.compact_min_waste)
        if order is not None:
            self.kv.gather(order)
        self.trunk_len = self.table.length
        self.g_last, self.pos_last = self._last_live(out, positions, valid)

    def _observe_static(self, tokens, taps, positions, valid, cursor, *, view: int) -> None:
        d = self.draft
        self.slots.view = view
        d.rope.forget()             # positions is a static buffer refilled in place
        g = d.fuse(taps)
        e = d.embed_tokens(tokens).to(g.dtype)
        out = self._static_step(e, g, positions, cursor, valid)
        g_last, pos_last = self._last_live(out, positions, valid)
        self.g_last.copy_(g_last)
        self.pos_last.copy_(pos_last)

    def _sample(self, g, greedy, temperature, noise):
        logits = self.draft.logits(g).float()
        if greedy:
            idx = logits.argmax(-1)
            return (idx if self.full_vocab else self.target_ids[idx]), None
        qd = probs_from_logits(logits, temperature)
        idx = sample_with_noise(qd, noise)
        if self.full_vocab:
            return idx, qd
        q = qd.new_zeros(qd.shape[0], self.draft.cfg.vocab_size)
        q[:, self.target_ids] = qd
        return self.target_ids[idx], q

    def _noise(self, batch, generator):
        return proposal_noise((batch, self.num_proposals, self.draft.cfg.draft_vocab_size), generator,
                              self.draft.fc.weight.device)

    @property
    def propose_width(self) -> int:
        return self.num_proposals - 1       # the chain's keys, written past the observed columns

    @staticmethod
    def _propose_settings(greedy, temperature) -> dict:
        return {"greedy": bool(greedy), "temperature": float(temperature)}

    @torch.no_grad()
    def propose(self, last_token, last_pos, *, greedy, temperature, generator):
        pos_last = self.sb.take(self.pos_last) if self.static else self.pos_last
        if (self.check_steps or not self.static) and not torch.equal(pos_last + 1, last_pos):
            raise RuntimeError("EAGLE-3 proposer out of step with the engine: last ingested positions "
                               f"{pos_last.tolist()} vs newest token positions {last_pos.tolist()}")
        noise = None if greedy else self._noise(last_token.shape[0], generator)
        if self.static:
            cursor = self.cursor.set(self.next_col, self.propose_width)
            extra = () if noise is None else (self.sb.stage("noise", noise),)
            toks, q = self._graphs["propose"](cursor, *extra, **self._propose_settings(greedy, temperature),
                                              view=self.view_after(self.propose_width))
            return self.sb.take(toks), self.sb.take(q)
        return self._chain(noise, greedy, temperature, lambda e, g, pos, m: self._step(e, g, pos))

    def _propose_static(self, cursor, *noise, greedy, temperature, view):
        self.slots.view = view
        self.draft.rope.forget()
        return self._chain(noise[0] if noise else None, greedy, temperature,
                           lambda e, g, pos, m: self._static_step(e, g, pos, cursor + m))

    def _round_static(self, tokens, taps, positions, valid, last_token, last_pos, cursor, *noise, views, **settings):
        """``observe`` then ``propose`` on the static caches, traced inside the engine's step (``begin_round``);
        the chain's keys go past the observed columns."""
        self._observe_static(tokens, torch.cat(taps, dim=-1), positions, valid, cursor, view=views[0])
        return self._propose_static(cursor + tokens.shape[1], *noise, view=views[1], **settings)

    def _chain(self, noise, greedy, temperature, step):
        """k chain proposals from ``g_last``: sample, then ``step(e, g, positions, m)`` runs pass m+1 at the same
        root (RoPE + m + 1) on the mode's caches."""
        toks, probs = [], []
        g = self.g_last
        for m in range(self.num_proposals):
            t, q = self._sample(g, greedy, temperature, None if noise is None else noise[:, m])
            toks.append(t)
            probs.append(q)
            if m + 1 < self.num_proposals:
                e = self.draft.embed_tokens(t).to(g.dtype)[:, None]
                g = step(e, g[:, None], (self.pos_last + m + 1)[:, None], m)[:, 0]
        return torch.stack(toks, 1), (None if greedy else torch.stack(probs, 1))
