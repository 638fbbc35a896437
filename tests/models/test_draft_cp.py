"""The drafts under context parallelism: each CP rank's share of the draft loss on its zigzag shard of a
packed batch (taps and policy logits sharded the same way) sums to the single-process loss, and the
gradients summed over the group equal the single-process gradients (fp64, CP=2, gloo).

    .venv/bin/python -m pytest -q tests/models/test_draft_cp.py
"""
import pytest
import torch
import torch.distributed as dist

from kernels.launch import spawn
from repro.models.block_draft import BlockDraftConfig, sample_anchors
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft
from repro.models.policy import build_policy
from repro.models.train_draft import policy_batch
from repro.models.vocab import build_draft_vocab
from repro.parallel.cp_batch import PackedShard, grpo_targets, padded_length

FAMILIES = ("eagle3", "dflash", "dspark")
pytestmark = pytest.mark.timeout(180)


def _draft(family, policy):
    torch.manual_seed(0)
    if family == "eagle3":                       # a reduced draft vocabulary: exercises the in-vocab mask
        counts = torch.arange(policy.vocab_size, 0, -1).float()
        d2t, t2d = build_draft_vocab(counts, 96)
        d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=3, draft_vocab_size=96), d2t=d2t, t2d=t2d)
        d = d.to(policy.dtype)
        d.init_from_policy(policy)
        return d
    cfg = BlockDraftConfig.from_policy(policy, num_layers=2, block_size=4, num_anchors=6)
    return (DFlashDraft if family == "dflash" else DSparkDraft)(cfg, policy).to(policy.dtype)


def _loss(family, d, ids, taps, logits, loss_mask, anchors, valid, cp=None):
    if family == "eagle3":
        return d.ttt_loss(ids, taps, logits, loss_mask, cp=cp)[0]
    if family == "dflash":
        return d.loss(ids, taps, loss_mask, anchors=anchors, anchor_valid=valid, cp=cp)
    return d.loss(ids, taps, logits, loss_mask, anchors=anchors, anchor_valid=valid, cp=cp)[0]


def _grads(d):
    return {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


def draft_cp_worker(rank, world, cases):
    """Every case in one process group (a spawn costs more than the cases on 2 cores)."""
    out = {case: _draft_case(rank, world, case) for case in cases}
    out["shard"] = shard_worker(rank, world)
    return out


def _draft_case(rank, world, case):
    torch.manual_seed(0)
    policy = build_policy("qwen3", "tiny", seed=5, dtype=torch.float64, init_std=0.3)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 127, (n,), generator=g).tolist() for n in (23, 17, 30)]
    plens = [5, 3, 9]
    out = {}
    for family in FAMILIES:
        d = _draft(family, policy)
        policy.set_taps(d.tap_spec)
        feats, batch = policy_batch(policy, seqs, plens)
        ids, lm, logits = batch.input_ids, batch.loss_mask, batch.policy_logits
        taps = feats.concat(d.tap_layers)
        anchors, valid = sample_anchors(lm, 6, torch.Generator().manual_seed(2))
        anchors[0, 0], valid[0, 0] = 4, True                  # an anchor at the start of the response
        valid[1, -1] = False                                  # a padded (invalid) block
        lengths = torch.tensor([len(s) for s in seqs])
        if case == "one_rank_blocks":                         # every anchor in chunk 0: rank 1 has no block
            anchors = torch.zeros_like(anchors)
            valid = torch.zeros_like(valid)
            valid[:, 0] = True
            anchors[:, 0] = torch.tensor([4, 2, 5])          # chunk 0 of rows of 23, 17, 30 tokens
        d.zero_grad(set_to_none=True)
        ref = _loss(family, d, ids, taps, logits, lm, anchors, valid)
        ref.backward()
        ref_grads = _grads(d)
        pad = padded_length(lengths, world) + (4 * world if case == "filler" else 0)
        shard = PackedShard.build(lengths, ids.shape[1], dist.group.WORLD, padded_total=pad)
        d.zero_grad(set_to_none=True)
        mine = _loss(family, d, ids, shard.local(taps), shard.local(logits), lm, anchors, valid, cp=shard)
        mine.backward()
        total = shard.all_sum(mine)
        grads = _grads(d)
        for n in ref_grads:
            grads.setdefault(n, torch.zeros_like(ref_grads[n]))
            dist.all_reduce(grads[n])
        out[family] = {"ref": ref.detach(), "cp": total, "ref_grads": ref_grads, "grads": grads,
                       "mine": float(mine.detach())}
    return out


CASES = ("plain", "filler", "one_rank_blocks")


@pytest.fixture(scope="module")
def cp2():
    return spawn(draft_cp_worker, 2, args=(CASES,), timeout_s=170)


@pytest.mark.parametrize("case", CASES)
def test_draft_cp2_loss_and_grads_equal_single_process(cp2, case):
    ranks = [r[case] for r in cp2]
    for family in FAMILIES:
        r = ranks[0][family]
        assert torch.isfinite(r["ref"]) and r["ref"] > 0
        torch.testing.assert_close(r["cp"], r["ref"], rtol=0, atol=1e-10, msg=f"{family}: loss")
        assert r["ref_grads"].keys() == r["grads"].keys() and len(r["ref_grads"]) > 5
        for n, gref in r["ref_grads"].items():
            torch.testing.assert_close(r["grads"][n], gref, rtol=0, atol=1e-10, msg=f"{family}: grad {n}")
        shares = [rk[family]["mine"] for rk in ranks]
        if case == "one_rank_blocks" and family != "eagle3":
            assert shares[1] == 0.0, "rank 1 holds no block, its share must be 0"
        else:
            assert all(s != 0.0 for s in shares), f"{family}: both ranks must hold part of the loss, got {shares}"


def shard_worker(rank, world):
    lengths = torch.tensor([5, 9, 1, 12])
    S = 12
    shard = PackedShard.build(lengths, S, dist.group.WORLD, padded_total=padded_length(lengths, world) + 2 * world)
    grid = torch.arange(4 * S, dtype=torch.float64).view(4, S) + 1
    b = torch.tensor([0, 0, 1, 3, 3, 2, 2, -1, 1])
    t = torch.tensor([0, 4, 8, 11, 12, 0, 1, 0, 9])
    fetched = shard.fetch(shard.local(grid)[:, None], b, t)[:, 0]
    ids = torch.arange(4 * S).view(4, S)
    tgt = grpo_targets(shard, ids, torch.ones(4, S), torch.zeros(4, S), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    return {"fetched": fetched, "b": shard.b, "t": shard.t, "tgt": tgt, "n": shard.num_local}


def test_packed_shard_rows_fetch_and_targets(cp2):
    ranks = [r["shard"] for r in cp2]
    lengths = [5, 9, 1, 12]
    # every real token is held by exactly one rank, once
    seen = sorted((int(b), int(t)) for r in ranks for b, t in zip(r["b"], r["t"]) if b >= 0)
    assert seen == [(b, t) for b, n in enumerate(lengths) for t in range(n)]
    assert ranks[0]["n"] == ranks[1]["n"]
    want = torch.tensor([1.0, 5.0, 21.0, 48.0, 0.0, 25.0, 0.0, 0.0, 0.0],   # (3,12), (2,1), b=-1, (1,9): off
                        dtype=torch.float64)
    for r in ranks:
        torch.testing.assert_close(r["fetched"], want)
        for (b, t), row in zip(zip(r["b"].tolist(), r["t"].tolist()), r["tgt"]):
            if b < 0 or t + 1 >= lengths[b]:
                assert float(row[1]) == 0.0
            else:
                assert row.tolist() == [b * 12 + t + 1, 1.0, 0.0, b + 1.0]


def test_packed_shard_rejects_bad_input():
    with pytest.raises(ValueError, match="row lengths must lie in"):
        PackedShard.build(torch.tensor([3, 0]), 4)
    with pytest.raises(ValueError, match="padded_total=5 is invalid"):
        PackedShard.build(torch.tensor([3, 4]), 4, padded_total=5)
