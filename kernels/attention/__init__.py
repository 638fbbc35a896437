"""Branch attention under context parallelism: packed zigzag ring + rank-local branches.

Public API (signatures are stable; ``group=None`` means one rank, a process group means CP):

    make_layout(cu_seqlens, group=None) -> Layout
        Zigzag sharding of a packed batch (rank r holds chunks r and 2C-1-r of every document, each
        document padded to a multiple of 2C). ``layout.shard(x)`` takes a global [T, ...] tensor to
        this rank's rows, ``layout.position_ids`` are their in-document positions (for RoPE),
        ``layout.locate(tokens)`` -> (doc, pos, owner_rank, local_row, is_back).

    eagle3_ttt_attention(q, k_passes, v_passes, cu_seqlens, group=None, *, scale=None,
                         backend="auto", return_lse=False, stats=None) -> out [T, H, D]
        Pass k (0-based) of EAGLE-3 training-time test, k = len(k_passes) - 1.
        q          [T, H, D]   pass-k queries of this rank's rows, RoPE at position_ids + k
        k_passes   k+1 tensors [T, G, D]: element 0 is pass 0 (the causal trunk), element m the
                   pass-m keys at RoPE position_ids + m;  v_passes likewise.  G divides H.
        Query i at pass k sees pass-0 keys j <= i of its document and its own keys of passes 1..k.
        T = cu_seqlens[-1] with one rank; with a group T = layout.num_local (zigzag shard).
        ``cu_seqlens`` may also be the Layout itself (build it once with make_layout and reuse it
        across passes and layers: saves rebuilding the index tensors on every call); with a group
        it must be: the Layout that sharded the inputs (its shard() checked the real token count;
        a bare cu_seqlens whose wrong total pads to the same shard size could not be caught).
        q, k, v: one floating dtype (integer tensors are refused before any communication).

    block_draft_attention(q, k, v, ctx_k, ctx_v, anchors, cu_seqlens, group=None, *,
                          slot_valid=None, block_valid=None, scale=None, backend="auto",
                          return_lse=False, stats=None) -> out [Nb, B, H, D]
        DFlash / DSpark blocks ([anchor, MASK x (B-1)]); aliases dflash_block_attention and
        dspark_block_attention (DSpark's Markov head is not attention).
        q [Nb, B, H, D], k/v [Nb, B, G, D]   block tokens at RoPE positions pos(anchor) + s
        ctx_k/ctx_v [T, G, D]                 context keys/values from target features (this rank's rows)
        anchors int64 [Nb]                    anchor index in the global (unpadded) packed stream; with a
                                              group only blocks whose anchor this rank holds
        slot_valid bool [Nb, B]               which block slots are visible keys (default all)
        block_valid bool [Nb]                 False: the block sees nothing (out 0)
        A block query sees context keys [doc start, anchor) and every valid slot of its own block.

    causal_attention(q, k, v, cu_seqlens, group=None, ...) -> out      (the trunk alone)

``stats`` (a ``RingStats``) collects bytes/messages/visible pairs per rank; ``return_lse`` also
returns the joint lse ([T, H] fp32/fp64, not differentiable). Out is differentiable w.r.t. every
tensor input. Backends (kernels/attention/backends): "auto", "torch" (pure torch, the fp64 oracle's
kernel), "sdpa_cpu" (torch's fused CPU kernels), "sdpa_cuda" (torch's bundled flash-attention 2,
varlen), "cudnn" (torch's cuDNN attention, per segment), "flex" (torch's flex_attention, every mask
kind), "flash4" (flash-attn-4, flash_attn.cute: varlen, prefix masks as one masked call; sm90+, when
installed; ``auto``'s first choice there), "flash_attn" (the external flash-attn 2/3 package, when
installed), "prefix_full[<name>]" (DFlash/DSpark prefix masks on a full-segment kernel), "tiled[<name>]"
(backward in bounded-memory tiles), "torch_bf16"; or a Backend instance (e.g.
TiledBackward(get("cudnn"), tile=8192)). One rank, flash-attn-4: kernels.attention.fused_block runs a
block draft's whole attention (context prefix and own block) as one masked call each way.

Examples (single rank; pass ``group`` and sharded tensors for CP):

    import torch
    from kernels.attention import eagle3_ttt_attention, block_draft_attention, make_layout
    cu = torch.tensor([0, 100, 256])                         # two packed documents
    T, H, G, D = 256, 4, 2, 32
    q2 = torch.randn(T, H, D, requires_grad=True)            # EAGLE-3 pass 2 (third pass)
    ks = [torch.randn(T, G, D, requires_grad=True) for _ in range(3)]
    vs = [torch.randn(T, G, D, requires_grad=True) for _ in range(3)]
    out = eagle3_ttt_attention(q2, ks, vs, cu)               # [T, H, D]
    out.sum().backward()

    Nb, B = 8, 4                                              # DFlash / DSpark
    anchors = torch.tensor([0, 10, 40, 99, 100, 130, 200, 255])
    bq = torch.randn(Nb, B, H, D); bk = torch.randn(Nb, B, G, D); bv = torch.randn(Nb, B, G, D)
    out = block_draft_attention(bq, bk, bv, ks[0], vs[0], anchors, cu)   # [Nb, B, H, D]
    plan = block_draft_plan(anchors, B, cu)           # once per batch, shared by every draft layer:
    out = block_draft_attention(bq, bk, bv, ks[0], vs[0], plan)

    # CP: lay = make_layout(cu, group); q_local = lay.shard(q_global); the same call with lay, group.
"""
from kernels.attention.api import (
                                   BlockPlan,
                                   block_draft_attention,
                                   block_draft_plan,
                                   causal_attention,
                                   dflash_block_attention,
                                   dspark_block_attention,
                                   eagle3_ttt_attention,
)
from kernels.attention.layout import Layout, make_layout, pad_varlen
from kernels.attention.merge import merge
from kernels.attention.reference import block_mask, causal_mask, dense_attention, eagle3_ttt_mask
from kernels.attention.ring import RingStats

__all__ = ["BlockPlan", "Layout", "RingStats", "block_draft_attention", "block_draft_plan", "block_mask",
           "causal_attention", "causal_mask", "dense_attention", "dflash_block_attention", "dspark_block_attention",
           "eagle3_ttt_attention", "eagle3_ttt_mask", "make_layout", "merge", "pad_varlen"]
