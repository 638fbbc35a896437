"""Front ends for the three draft families (single rank or CP), built on trunk_branch_attention.

See kernels/attention/__init__.py for shapes and examples. All inputs are checked before any
communication starts; a bad value raises ValueError/TypeError naming it and what was expected.

Under context parallelism the packed batch is described by the ``Layout`` that sharded it
(``make_layout(cu_seqlens, group)``; ``layout.shard`` checks the global tensors' rows against
``cu_seqlens[-1]``, the real token count). A bare ``cu_seqlens`` is refused there: a rank's local rows are
padded per document, so a wrong total that pads to the same shard size could not be told from the right one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernels.attention.backends import NAMES, Backend
from kernels.attention.branch import BlockBranch, TTTBranch
from kernels.attention.layout import Layout, group_rank_size, make_layout
from kernels.attention.plan import RingPlan, causal_plan, prefix_plan
from kernels.attention.ring import RingStats
from kernels.attention.staging import to_device
from kernels.attention.trunk_branch import trunk_branch_attention


def _layout(cu_seqlens, group) -> Layout:
    r, C = group_rank_size(group)
    if isinstance(cu_seqlens, Layout):
        lay = cu_seqlens
        if lay.cp_size != C or lay.rank != r:
            raise ValueError(f"layout was built for cp_size={lay.cp_size} rank={lay.rank}, but the group has "
                             f"size {C} and this process is rank {r}")
        return lay
    if C > 1:
        total = int(cu_seqlens[-1]) if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.numel() else None
        raise ValueError(f"under context parallelism (cp_size={C}) pass the Layout that sharded the inputs "
                         f"(make_layout(cu_seqlens, group); its shard() checks the real token count), not a bare "
                         f"cu_seqlens (total {total}): local rows are padded per document, so its total cannot be "
                         "checked against this rank's rows")
    return make_layout(cu_seqlens, group)


def _floating(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (fp16/bf16/fp32/fp64), got {x.dtype}")


def _check_backend(backend):
    if not isinstance(backend, Backend) and backend not in NAMES:
        raise ValueError(f"backend must be one of {NAMES} or a Backend, got {backend!r}")


def _check_same(name: str, x: torch.Tensor, ref: torch.Tensor, shape) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype}, expected {ref.dtype} (the dtype of q)")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device}, expected {ref.device} (the device of q)")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def _heads(q: torch.Tensor, G: int) -> None:
    if q.shape[-2] % G != 0:
        raise ValueError(f"query heads H={q.shape[-2]} must be a multiple of key/value heads G={G}")


def causal_attention(q, k, v, cu_seqlens, group=None, *, scale=None, backend="auto", return_lse=False,
                     stats: RingStats | None = None):
    """Packed causal attention (the trunk alone; EAGLE-3 pass 0). Shapes as eagle3_ttt_attention."""
    return eagle3_ttt_attention(q, [k], [v], cu_seqlens, group, scale=scale, backend=backend,
                                return_lse=return_lse, stats=stats)


def eagle3_ttt_attention(q: torch.Tensor, k_passes: Sequence[torch.Tensor], v_passes: Sequence[torch.Tensor],
                         cu_seqlens, group=None, *, scale: float | None = None, backend="auto",
                         return_lse: bool = False, stats: RingStats | None = None):
    """EAGLE-3 TTT attention of pass k = len(k_passes) - 1; see the package docstring."""
    lay = _layout(cu_seqlens, group)
    _check_backend(backend)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a [T, H, D] tensor, got {getattr(q, 'shape', type(q))}")
    _floating("q", q)
    if len(k_passes) < 1 or len(k_passes) != len(v_passes):
        raise ValueError(f"k_passes and v_passes must be equally long and non-empty (pass 0 is the trunk), "
                         f"got {len(k_passes)} and {len(v_passes)}")
    T, _H, D = q.shape
    if T != lay.num_local:
        raise ValueError(f"q has {T} rows but this rank holds {lay.num_local} rows of the packed batch "
                         f"(cu_seqlens[-1]={lay.num_real}, cp_size={lay.cp_size}); shard with make_layout")
    G = k_passes[0].shape[1] if k_passes[0].dim() == 3 else -1
    for i, (k, v) in enumerate(zip(k_passes, v_passes)):
        _check_same(f"k_passes[{i}]", k, q, (T, G, D))
        _check_same(f"v_passes[{i}]", v, q, (T, G, D))
    _heads(q, G)
    scale = D ** -0.5 if scale is None else float(scale)
    plan = causal_plan(lay, q.device)
    P = len(k_passes) - 1
    branch = TTTBranch(P) if P > 0 else None
    out, lse = trunk_branch_attention(q, k_passes[0], v_passes[0], plan, group, branch,
                                      (*k_passes[1:], *v_passes[1:]), scale=scale, backend=backend,
                                      stats=stats)
    return (out, lse) if return_lse else out


# One rank on flash-attn-4: block-draft attention by the packed context's length, from Figure 6 on one H200 (fwd+bwd,
# 64 blocks of 16 per sequence, every route in one run): one masked call over [context; blocks] each way up to 64K
# tokens (5.5 / 5.6 / 9.3 ms at 16K / 32K / 64K against the masked trunk+branch route's 9.3 / 6.9 / 9.6), the
# masked trunk+branch route ("auto"'s own pick) to 128K, replicated segments from 256K (22.5 ms against 25.9).
ONE_CALL_MAX_TOKENS = 65536
REPLICATED_MIN_TOKENS = 262144


def _flash4_here(q: torch.Tensor) -> bool:
    """Whether flash-attn-4 runs on ``q``'s device and dtype (imported, sm90+, fp16/bf16)."""
    from kernels.attention import backends
    return backends.get("flash4").unavailable_reason(None, q.device, q.dtype) is None


def block_route(backend, plan: "BlockPlan", q: torch.Tensor, return_lse: bool = False):
    """What ``block_draft_attention`` runs: "one_call" (``kernels.attention.fused_block``) or the backend of the
    trunk+branch route. Only ``backend="auto"`` at one rank, on flash-attn-4 and without ``return_lse``, changes
    with the length; any other request runs as named."""
    if backend != "auto" or plan.bounds is None or plan.num_blocks == 0 or return_lse or not _flash4_here(q):
        return backend
    tokens = plan.layout.num_local
    if tokens <= ONE_CALL_MAX_TOKENS:
        return "one_call"
    return "prefix_full[flash4]" if tokens >= REPLICATED_MIN_TOKENS else backend


@dataclass(frozen=True)
class BlockPlan:
    """What block attention derives from the anchors and the layout, once per batch: every draft layer of a
    forward attends with the same blocks, so the layers share one plan instead of rebuilding it per call
    (locating anchors, sorting them, the ring plan and its prefix masks: host work at RL batch shapes)."""
    num_blocks: int
    block: int
    layout: Layout
    order: torch.Tensor          # blocks sorted by anchor (device)
    inverse: torch.Tensor        # back to the caller's order (device)
    ring: RingPlan
    branch: BlockBranch
    bounds: tuple | None = None  # one rank: each block's context [lo, hi), slot_valid, block_valid (host)
    one_call: dict = field(default_factory=dict, compare=False)   # the one-call route's mask problem, once built

    def one_call_problem(self):
        """The "block" mask problem of the one-call route, for the plan's device (built on first use, shared by the
        layers)."""
        if "problem" not in self.one_call:
            from kernels.attention.fused_block import block_problem
            lo, hi, sv, bv = self.bounds
            self.one_call["problem"] = block_problem(lo.view(1, -1), hi.view(1, -1), sv.reshape(1, -1),
                                                     bv.view(1, -1), self.block, self.layout.num_local,
                                                     device=self.order.device)
        return self.one_call["problem"]


def block_draft_plan(anchors: torch.Tensor, block: int, cu_seqlens, group=None, *,
                     slot_valid: torch.Tensor | None = None, block_valid: torch.Tensor | None = None,
                     device=None) -> BlockPlan:
    """The plan of ``block_draft_attention`` for blocks of ``block`` slots at ``anchors``; see there."""
    lay = _layout(cu_seqlens, group)
    if not isinstance(anchors, torch.Tensor) or anchors.dim() != 1:
        raise ValueError(f"anchors must be a 1-D tensor of global token indices, got "
                         f"{getattr(anchors, 'shape', type(anchors))}")
    if anchors.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"anchors must be int32/int64 token indices, got {anchors.dtype}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive number of slots, got {block!r}")
    Nb, B = anchors.numel(), block
    device = anchors.device if device is None else torch.device(device)
    # the plan is built on the host (given device tensors are read once) and moved without waits
    slot_valid = torch.ones(Nb, B, dtype=torch.bool) if slot_valid is None else slot_valid.to("cpu", torch.bool)
    block_valid = torch.ones(Nb, dtype=torch.bool) if block_valid is None else block_valid.to("cpu", torch.bool)
    if tuple(slot_valid.shape) != (Nb, B):
        raise ValueError(f"slot_valid has shape {tuple(slot_valid.shape)}, expected {(Nb, B)}")
    if tuple(block_valid.shape) != (Nb,):
        raise ValueError(f"block_valid has shape {tuple(block_valid.shape)}, expected {(Nb,)}")
    doc, _pos, owner, local, back = lay.locate(anchors)
    if bool((owner != lay.rank).any()):
        bad = anchors.cpu()[owner != lay.rank][:8].tolist()
        raise ValueError(f"anchors {bad} are owned by other ranks (rank {lay.rank} of {lay.cp_size}); "
                         "pass only blocks whose anchor this rank holds (layout.locate(anchors)[2])")
    order = torch.argsort(anchors.cpu(), stable=True)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(Nb)
    rows = lambda x: x.repeat_interleave(B)
    ring = prefix_plan(lay, rows(doc[order]), rows(local[order]), rows(back[order]),
                       rows(block_valid[order]), device)
    branch = BlockBranch(B, to_device((slot_valid & block_valid.unsqueeze(1)).index_select(0, order), device))
    bounds = None
    if lay.cp_size == 1:      # one rank: a block sees its document's local rows up to its anchor's
        bounds = (lay.cu_local.cpu()[doc], local, slot_valid, block_valid)
    return BlockPlan(Nb, B, lay, to_device(order, device), to_device(inv, device), ring, branch, bounds)


def block_draft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor,
                          ctx_v: torch.Tensor, anchors, cu_seqlens=None, group=None, *,
                          slot_valid: torch.Tensor | None = None, block_valid: torch.Tensor | None = None,
                          scale: float | None = None, backend="auto", return_lse: bool = False,
                          stats: RingStats | None = None):
    """DFlash / DSpark block attention; see the package docstring. ``anchors`` may be a ``BlockPlan``
    (``block_draft_plan``) shared by several calls over the same blocks; ``cu_seqlens``, ``slot_valid`` and
    ``block_valid`` are then the plan's."""
    _check_backend(backend)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a [Nb, B, H, D] tensor, got {getattr(q, 'shape', type(q))}")
    _floating("q", q)
    Nb, B, H, D = q.shape
    if isinstance(anchors, BlockPlan):
        plan = anchors
        if slot_valid is not None or block_valid is not None or cu_seqlens is not None:
            raise ValueError("with a BlockPlan, pass cu_seqlens/slot_valid/block_valid to block_draft_plan instead")
        if (plan.num_blocks, plan.block) != (Nb, B):
            raise ValueError(f"the BlockPlan is for {plan.num_blocks} blocks of {plan.block} slots, q has {Nb} of {B}")
        _layout(plan.layout, group)                      # the plan's layout must be this rank's
    else:
        if cu_seqlens is None:
            raise ValueError("block_draft_attention needs cu_seqlens (or a Layout) when anchors is a tensor")
        if not isinstance(anchors, torch.Tensor) or anchors.dim() != 1 or anchors.numel() != Nb:
            raise ValueError(f"anchors must be a 1-D tensor of {Nb} global token indices, got "
                             f"{getattr(anchors, 'shape', type(anchors))}")
        plan = None
    lay = plan.layout if plan is not None else _layout(cu_seqlens, group)
    G = k.shape[2] if k.dim() == 4 else -1
    _check_same("k", k, q, (Nb, B, G, D))
    _check_same("v", v, q, (Nb, B, G, D))
    _check_same("ctx_k", ctx_k, q, (lay.num_local, G, D))
    _check_same("ctx_v", ctx_v, q, (lay.num_local, G, D))
    _heads(q, G)
    if plan is None:
        plan = block_draft_plan(anchors, B, lay, group, slot_valid=slot_valid, block_valid=block_valid,
                                device=q.device)
    scale = D ** -0.5 if scale is None else float(scale)
    route = block_route(backend, plan, q, return_lse)
    if route == "one_call":
        from kernels.attention.fused_block import one_call_attention
        flat = lambda x: x.reshape(1, Nb * B, *x.shape[2:])
        out = one_call_attention(plan.one_call_problem(), flat(q), flat(k), flat(v), ctx_k.unsqueeze(0),
                                 ctx_v.unsqueeze(0), scale)
        return out.view(q.shape)
    backend = route
    od = plan.order
    qs = q.index_select(0, od).reshape(Nb * B, H, D)
    out, lse = trunk_branch_attention(qs, ctx_k, ctx_v, plan.ring, group, plan.branch,
                                      (k.index_select(0, od), v.index_select(0, od)), scale=scale,
                                      backend=backend, stats=stats)
    out = out.view(Nb, B, H, D).index_select(0, plan.inverse)
    if return_lse:
        return out, lse.view(Nb, B, H).index_select(0, plan.inverse)
    return out


dflash_block_attention = block_draft_attention
dspark_block_attention = block_draft_attention
