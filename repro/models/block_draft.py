"""The block-draft backbone shared by DFlash and DSpark, its anchor sampler, and its block proposer.

Backbone (shared/reference/draft_families.md section 2.1): the taps are fused once,
``H_ctx = hidden_norm(fc(cat(taps)))``, and injected as keys/values into *every* draft layer
(``k_norm(k_proj(H_ctx))``, ``v_proj(H_ctx)``; no layernorm on the context). Queries come only from
the block ``[x_a, MASK x (B-1)]`` at positions ``a..a+B-1``, which sees the context strictly before
the anchor and its whole block (bidirectional): ``kernels.attention.block_draft_attention`` in
training, the ``SlotTable`` cache mask at inference. Embedding and head are the policy's own
(referenced, not owned: the policy's optimizer owns them).

Under context parallelism (``forward_blocks_cp``) each rank runs the blocks whose anchor it holds
against its zigzag rows of the context, on the CP group's ring (``repro.parallel.cp_batch.PackedShard``).

Families differ in what the block's slots predict and how proposals are drawn (``repro.models.dflash``
and ``repro.models.dspark``); ``BlockProposer`` runs either for the rollout engine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernels.attention import block_draft_attention, block_draft_plan, block_mask, dense_attention
from kernels.attention.padded import padded_block_attention, padded_block_mask
from repro.decoding.kv import SlotTable
from repro.decoding.sampling import proposal_noise
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
from repro.models.taps import TapSpec
from repro.parallel.cp_batch import PackedShard

# "padded": one masked SDPA over the right-padded rows (kernels.attention.padded; no host work, CUDA-graph safe);
# "kernels": the packed ring route (block_draft_attention, the CP path's kernel at one rank); "dense": the oracle
ATTN_IMPLS = ("padded", "kernels", "dense")


def capturing() -> bool:
    """Whether a CUDA graph is being recorded on the current stream (never on a CPU-only build)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclass
class BlockDraftConfig:
    target_hidden: int
    vocab_size: int
    tap_spec: TapSpec
    mask_token_id: int
    num_layers: int = 2
    block_size: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 0
    decay_gamma: float = 4.0
    num_anchors: int = 16
    rope_theta: float = 1e4
    rms_eps: float = 1e-6

    def __post_init__(self) -> None:
        self.intermediate_size = self.intermediate_size or 2 * self.target_hidden
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (an anchor plus at least one MASK slot), got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be >= 1, got {self.num_anchors}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @classmethod
    def from_policy(cls, policy, num_layers: int = 2, tap_spec: TapSpec | None = None,
                    mask_token_id: int | None = None, **kw) -> BlockDraftConfig:
        """Draft shaped like the policy; the MASK id defaults to the last vocabulary id (reserved there)."""
        c = policy.config
        kw.setdefault("num_heads", c.num_attention_heads)
        kw.setdefault("num_kv_heads", c.num_key_value_heads)
        kw.setdefault("head_dim", getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        kw.setdefault("intermediate_size", c.intermediate_size)
        kw.setdefault("rope_theta", float(getattr(c, "rope_theta", None) or 1e4))
        return cls(target_hidden=policy.hidden_size, vocab_size=policy.vocab_size,
                   tap_spec=tap_spec or TapSpec.dflash_default(policy.num_layers, num_layers),
                   mask_token_id=policy.vocab_size - 1 if mask_token_id is None else mask_token_id,
                   num_layers=num_layers, **kw)


class BlockLayer(nn.Module):
    """A Qwen3-style layer whose keys/values also cover the injected context."""

    def __init__(self, cfg: BlockDraftConfig):
        super().__init__()
        H, nh, g, hd = cfg.target_hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.nh, self.g, self.hd = nh, g, hd
        self.input_layernorm = RMSNorm(H, cfg.rms_eps)
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, g * hd, bias=False)
        self.v_proj = nn.Linear(H, g * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_eps)
        self.mlp = SwiGLU(H, cfg.intermediate_size)

    def kv(self, x: torch.Tensor, positions: torch.Tensor, rope: Rotary):
        lead = x.shape[:-1]
        k = self.k_norm(self.k_proj(x).view(*lead, self.g, self.hd))
        return rope(k, positions), self.v_proj(x).view(*lead, self.g, self.hd)

    def block_qkv(self, h: torch.Tensor, positions: torch.Tensor, rope: Rotary):
        x = self.input_layernorm(h)
        q = self.q_norm(self.q_proj(x).view(*x.shape[:-1], self.nh, self.hd))
        k, v = self.kv(x, positions, rope)
        return rope(q, positions), k, v

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn.flatten(-2))
        return h + self.mlp(self.post_attention_layernorm(h))


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None):
    """Up to ``num_anchors`` distinct anchors per row, uniformly among positions ``a`` with ``a + 1 < S``
    and ``loss_mask[a]`` (the prediction of ``x_{a+1}`` counts), sorted; returns ``(anchors [B, N] long,
    valid [B, N] bool)``, missing anchors padded with 0 and ``valid = False``.

    One draw for the whole batch: every position gets a uniform random key (candidates below 1, the rest
    at 2), and each row keeps its ``N`` smallest keys, a uniform random subset of its candidates (all of
    them when there are fewer). The mask crosses to the host once, not once per row."""
    B, S = loss_mask.shape
    ok = loss_mask.detach().to("cpu").bool().clone()
    ok[:, S - 1:] = False
    keys = torch.rand(B, S, generator=generator).masked_fill_(~ok, 2.0)
    n = min(num_anchors, S)
    pick = keys.topk(n, dim=1, largest=False).indices
    valid = ok.gather(1, pick)
    pick = torch.where(valid, pick, torch.full_like(pick, S)).sort(dim=1).values     # invalid ones last
    valid = pick < S
    anchors = torch.zeros(B, num_anchors, dtype=torch.long)
    anchor_valid = torch.zeros(B, num_anchors, dtype=torch.bool)
    anchors[:, :n] = torch.where(valid, pick, torch.zeros_like(pick))
    anchor_valid[:, :n] = valid
    return anchors.to(loss_mask.device), anchor_valid.to(loss_mask.device)


class BlockDraftBackbone(nn.Module):
    """fc + hidden_norm context, ``num_layers`` block layers, final norm; embedding/head from the policy."""

    def __init__(self, cfg: BlockDraftConfig):
        super().__init__()
        self.cfg = cfg
        n_taps = len(cfg.tap_spec.layers)
        self.fc = nn.Linear(n_taps * cfg.target_hidden, cfg.target_hidden, bias=False)
        self.hidden_norm = RMSNorm(cfg.target_hidden, cfg.rms_eps)
        self.layers = nn.ModuleList([BlockLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.target_hidden, cfg.rms_eps)
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta)
        self._policy_parts: list[nn.Module] = []      # [embedding, head], deliberately not registered

    def attach(self, policy) -> None:
        emb, head = policy.embed_tokens, policy.lm_head
        if emb.weight.shape != (self.cfg.vocab_size, self.cfg.target_hidden):
            raise ValueError(f"policy embedding is {tuple(emb.weight.shape)}, expected "
                             f"{(self.cfg.vocab_size, self.cfg.target_hidden)}")
        self._policy_parts = [emb, head]

    def _parts(self):
        if not self._policy_parts:
            raise RuntimeError("block draft has no embedding/head: call draft.attach(policy) first")
        return self._policy_parts

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._parts()[0](ids).to(self.fc.weight.dtype)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        head = self._parts()[1]
        return head(h.to(head.weight.dtype))

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        want = len(self.cfg.tap_spec.layers) * self.cfg.target_hidden
        if taps.shape[-1] != want:
            raise ValueError(f"fused taps have {taps.shape[-1]} features, expected {want} "
                             f"({len(self.cfg.tap_spec.layers)} taps x hidden {self.cfg.target_hidden})")
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))

    def block_inputs(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """``[..., B]`` ids ``[x_a, MASK, ..., MASK]`` from anchor tokens ``[...]``."""
        ids = torch.full((*anchor_tokens.shape, self.cfg.block_size), self.cfg.mask_token_id,
                         dtype=torch.long, device=anchor_tokens.device)
        ids[..., 0] = anchor_tokens
        return ids

    def forward_blocks(self, input_ids: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor,
                       anchor_valid: torch.Tensor, attn_impl: str = "kernels", backend: str = "auto"):
        """Final hidden states ``[B, N, Bs, H]`` of the blocks at ``anchors [B, N]`` of a right-padded batch."""
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl {attn_impl!r} is not one of {ATTN_IMPLS}")
        Bt, S = input_ids.shape
        if taps.shape[:2] != (Bt, S):
            raise ValueError(f"taps are {tuple(taps.shape[:2])}, expected [batch, seq] = {(Bt, S)}")
        if anchors.shape != anchor_valid.shape or anchors.shape[0] != Bt:
            raise ValueError(f"anchors {tuple(anchors.shape)} and anchor_valid {tuple(anchor_valid.shape)} must "
                             f"both be [batch={Bt}, N]")
        if not capturing():                                    # reading anchors back is a host sync
            bad = anchor_valid & ((anchors < 0) | (anchors >= S))
            if bad.any():
                raise ValueError(f"anchors {anchors[bad][:4].tolist()} are outside the sequence [0, {S})")
        N, Bs, dev = anchors.shape[1], self.cfg.block_size, input_ids.device
        if attn_impl == "padded":
            return self._forward_padded(input_ids, taps, anchors, anchor_valid)
        cu = row_cu_seqlens(Bt, S, dev) if attn_impl == "dense" else row_layout(Bt, S)
        ctx = batch_to_packed(self.context(taps))                              # [T, H]
        ctx_pos = torch.arange(S, device=dev).repeat(Bt)
        glob = (anchors + torch.arange(Bt, device=dev)[:, None] * S).flatten()  # [Nb]
        blk_valid = anchor_valid.flatten()
        a_tok = input_ids.gather(1, anchors)                                     # [B, N]
        h = self.embed(self.block_inputs(a_tok)).flatten(0, 1)                   # [Nb, Bs, H]
        pos = anchors.flatten()[:, None] + torch.arange(Bs, device=dev)          # [Nb, Bs]
        h = self._layers(h, pos, ctx, ctx_pos, glob, blk_valid, cu, None, attn_impl, backend)
        return self.norm(h).view(Bt, N, Bs, -1)

    def _forward_padded(self, input_ids, taps, anchors, anchor_valid):
        """``forward_blocks`` with every row's blocks against its own context in one masked SDPA per layer."""
        Bt, S = input_ids.shape
        N, Bs, dev = anchors.shape[1], self.cfg.block_size, input_ids.device
        ctx = self.context(taps)                                                 # [B, S, H]
        ctx_pos = torch.arange(S, device=dev)
        h = self.embed(self.block_inputs(input_ids.gather(1, anchors))).flatten(1, 2)   # [B, N*Bs, H]
        pos = (anchors[..., None] + torch.arange(Bs, device=dev)).flatten(1)            # [B, N*Bs]
        valid = anchor_valid.bool()
        mask = padded_block_mask(anchors, valid, Bs, S)                          # shared by every layer
        for layer in self.layers:
            q, k, v = layer.block_qkv(h, pos, self.rope)
            ck, cv = layer.kv(ctx, ctx_pos, self.rope)
            h = layer.finish(h, padded_block_attention(q, k, v, ck, cv, anchors, valid, mask=mask))
        return self.norm(h).view(Bt, N, Bs, -1)

    def _layers(self, h, pos, ctx, ctx_pos, glob, blk_valid, cu, group, attn_impl, backend):
        """The block layers over blocks ``h [Nb, Bs, H]`` at ``pos``, anchored at packed rows ``glob``."""
        scale = self.cfg.head_dim ** -0.5
        dense_mask = None
        plan = (block_draft_plan(glob, h.shape[1], cu, group, block_valid=blk_valid, device=h.device)
                if attn_impl == "kernels" else None)           # one plan for every layer of this forward
        for layer in self.layers:
            q, k, v = layer.block_qkv(h, pos, self.rope)
            ck, cv = layer.kv(ctx, ctx_pos, self.rope)
            if attn_impl == "kernels":
                a = block_draft_attention(q, k, v, ck, cv, plan, None, group, backend=backend)
            else:
                if dense_mask is None:
                    dense_mask = block_mask(cu.cpu(), glob.cpu(), h.shape[1],
                                            block_valid=blk_valid.cpu()).to(h.device)
                Nb = q.shape[0]
                a, _ = dense_attention(q.flatten(0, 1), torch.cat([ck, k.flatten(0, 1)]),
                                       torch.cat([cv, v.flatten(0, 1)]), dense_mask, scale)
                a = a.view(Nb, h.shape[1], *a.shape[1:])
            h = layer.finish(h, a)
        return h

    def forward_blocks_cp(self, input_ids: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor,
                          anchor_valid: torch.Tensor, cp: PackedShard, backend: str = "auto"):
        """The blocks of ``forward_blocks`` whose anchor this CP rank holds, on the group's ring.

        ``input_ids [B, S]``, ``anchors``/``anchor_valid [B, N]`` are the whole microbatch's (the same on
        every rank), ``taps`` this rank's rows ``[T_local, F]``. Returns the final hidden states
        ``[Nb_local, Bs, H]`` and ``sel [B, N]`` (bool): which blocks they are, in row-major order."""
        Bt, S = input_ids.shape
        if (Bt, S) != (cp.lengths.numel(), cp.seq_len):
            raise ValueError(f"input_ids are {(Bt, S)}, but the PackedShard describes a [{cp.lengths.numel()}, "
                             f"{cp.seq_len}] batch")
        if anchors.shape != anchor_valid.shape or anchors.shape[0] != Bt:
            raise ValueError(f"anchors {tuple(anchors.shape)} and anchor_valid {tuple(anchor_valid.shape)} must "
                             f"both be [batch={Bt}, N]")
        taps = taps.reshape(-1, taps.shape[-1])
        if taps.shape[0] != cp.num_local:
            raise ValueError(f"taps have {taps.shape[0]} rows, expected this CP rank's {cp.num_local} rows")
        dev, Bs = input_ids.device, self.cfg.block_size
        rows = torch.arange(Bt)[:, None].expand_as(anchors.cpu())
        valid = anchor_valid.cpu().bool()
        real = cp.valid(rows, anchors.cpu())
        if bool((valid & ~real).any()):
            bad = anchors.cpu()[valid & ~real][:4].tolist()
            raise ValueError(f"anchors {bad} are valid but not real tokens of their rows (lengths "
                             f"{cp.lengths.tolist()}): under CP every anchor must be a real token")
        sel = valid & (cp.owner(rows, anchors.cpu()) == cp.rank)
        b_s, a_s = rows[sel], anchors.cpu()[sel]
        ctx = self.context(taps)                                                 # [T_local, H]
        h = self.embed(self.block_inputs(input_ids[b_s.to(dev), a_s.to(dev)]))    # [Nb_local, Bs, H]
        pos = a_s.to(dev)[:, None] + torch.arange(Bs, device=dev)
        ones = torch.ones(b_s.numel(), dtype=torch.bool, device=dev)
        h = self._layers(h, pos, ctx, cp.position_ids.to(dev), cp.flat_index(b_s, a_s).to(dev), ones,
                         cp.layout, cp.group, "kernels", backend)
        return self.norm(h), sel.to(dev)


class BlockProposer(StaticProposerState):
    """Proposals from a DFlash or DSpark draft: one backbone pass per verify step over
    ``[newest token, MASK x (B-1)]``, context keys/values cached across steps.

    Two cache modes, as ``repro.models.eagle3.Eagle3Proposer``: ``reset(batch)`` (growing, compacted
    caches) or ``prepare(batch, max_slots, cuda_graphs=...)`` (static ``[B, G, S_max, D]`` caches; the
    per-verify-step ``observe`` and ``propose`` run as CUDA graphs on a GPU)."""

    def __init__(self, draft):
        self.draft = draft
        self.num_proposals = draft.num_proposals
        self.init_static_state()

    def reset(self, batch: int) -> None:
        self.static = False
        self.table = SlotTable(batch, self.draft.backbone.fc.weight.device)
        self.kvs = [DraftKV() for _ in self.draft.backbone.layers]

    def prepare(self, batch: int, max_slots: int, *, cuda_graphs: bool = False) -> None:
        """Static-cache mode for one request of ``batch`` rows writing at most ``max_slots`` columns."""
        bb = self.draft.backbone
        c, dev, dt = bb.cfg, bb.fc.weight.device, bb.fc.weight.dtype
        self.prepare_static(batch, max_slots, dt, dev, cuda_graphs=cuda_graphs, name="block", extra=lambda: {
            "skvs": [StaticKV(batch, c.num_kv_heads, max_slots, c.head_dim, dt, dev) for _ in bb.layers]})

    def select(self, rows: torch.Tensor) -> None:
        if self.static:
            self.sb.select(rows)
            return
        self.table.select(rows)
        for kv in self.kvs:
            kv.select(rows)

    @torch.no_grad()
    def observe(self, next_tokens, taps, positions, valid) -> None:
        if self.static:
            self.observe_static(positions.shape[1], [("taps", torch.cat(taps, dim=-1), None),
                                                     ("pos", positions, None), ("valid", valid, False)])
            return
        bb = self.draft.backbone
        ctx = bb.context(torch.cat(taps, dim=-1))
        self.table.append(positions, valid)
        for layer, kv in zip(bb.layers, self.kvs):
            kv.append(*layer.kv(ctx, positions, bb.rope))
        tail = self.table.dead_tail()
        if tail:
            self.table.trim(self.table.length - tail)
            for kv in self.kvs:
                kv.trim(self.table.length)
        order = self.table.compact(self.compact_min_waste)
        if order is not None:
            for kv in self.kvs:
                kv.gather(order)

    def _observe_static(self, taps, positions, valid, cursor, *, view: int) -> None:   # view: no attention here
        bb = self.draft.backbone
        bb.rope.forget()            # positions is a static buffer refilled in place
        ctx = bb.context(taps)
        cols = self.slots.write(cursor, positions, valid)
        for layer, kv in zip(bb.layers, self.skvs):
            kv.write(cols, *layer.kv(ctx, positions, bb.rope))

    @torch.no_grad()
    def block_hidden(self, last_token: torch.Tensor, last_pos: torch.Tensor) -> torch.Tensor:
        """Final hidden ``[B, Bs, H]`` of the block anchored at the newest token (context < anchor)."""
        if self.static:
            return self._block_hidden(last_token, last_pos, self.skvs, self.slots.visible)
        return self._block_hidden(last_token, last_pos, self.kvs, self.table.visible)

    def _block_hidden(self, last_token, last_pos, kvs, visible) -> torch.Tensor:
        bb = self.draft.backbone
        Bs = bb.cfg.block_size
        pos = last_pos[:, None] + torch.arange(Bs, device=last_pos.device)
        vis_ctx = visible((last_pos - 1)[:, None].expand(-1, Bs))                  # strictly before anchor
        vis = torch.cat([vis_ctx, torch.ones(*vis_ctx.shape[:2], Bs, dtype=torch.bool,
                                             device=vis_ctx.device)], dim=2)
        h = bb.embed(bb.block_inputs(last_token))
        S = vis_ctx.shape[2]        # the static caches' view, or the growing caches' length
        for layer, kv in zip(bb.layers, kvs):
            q, k, v = layer.block_qkv(h, pos, bb.rope)
            K = torch.cat([kv.k[:, :, :S], k.transpose(1, 2).to(kv.k.dtype)], dim=2)
            V = torch.cat([kv.v[:, :, :S], v.transpose(1, 2).to(kv.v.dtype)], dim=2)
            h = layer.finish(h, cache_attention(q, K, V, vis, sees_a_key=True))   # the block sees itself
        return bb.norm(h)

    @torch.no_grad()
    def propose(self, last_token, last_pos, *, greedy, temperature, generator):
        noise = None if greedy else self._noise(last_token.shape[0], generator)
        if self.static:
            sb = self.sb
            extra = () if noise is None else (sb.stage("noise", noise),)
            out = self._graphs["propose"](sb.stage("last_tok", last_token), sb.stage("last_pos", last_pos), *extra,
                                          **self._propose_settings(greedy, temperature), view=self.view_after(0))
            return tuple(sb.take(x) for x in out)
        hidden = self.block_hidden(last_token, last_pos)
        return self.draft.sample_block(hidden, last_token, greedy=greedy, temperature=temperature, noise=noise)

    def _noise(self, batch, generator):
        return proposal_noise((batch, self.num_proposals, self.draft.cfg.vocab_size), generator,
                              self.draft.backbone.fc.weight.device)

    def _propose_settings(self, greedy, temperature) -> dict:
        return {"greedy": bool(greedy), "temperature": float(temperature),
                "confidence_threshold": float(getattr(self.draft, "confidence_threshold", 0.0))}

    def _round_static(self, tokens, taps, positions, valid, last_token, last_pos, cursor, *noise, views, **settings):
        """``observe`` then ``propose`` on the static caches, traced inside the engine's step (``begin_round``)."""
        self._observe_static(torch.cat(taps, dim=-1), positions, valid, cursor, view=views[0])
        return self._propose_static(last_token, last_pos, *noise, view=views[1], **settings)

    def _propose_static(self, last_token, last_pos, *noise, greedy, temperature, confidence_threshold, view):
        # confidence_threshold (DSpark's, read by sample_block) is an argument so that graphs are keyed by it
        self.slots.view = view
        self.draft.backbone.rope.forget()
        hidden = self._block_hidden(last_token, last_pos, self.skvs, self.slots.visible)
        return self.draft.sample_block(hidden, last_token, greedy=greedy, temperature=temperature,
                                       noise=noise[0] if noise else None)
