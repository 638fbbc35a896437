"""The joint GRPO + draft update under pipeline parallelism: policy stages, the draft on the last stage,
TapChannel.

One rank per stage (``Schedule1F1B``; gloo on CPU, NCCL on GPUs). Every rank builds the same policy
and draft from the state dicts it is given, keeps its stage of the policy (``repro.parallel.model``),
and hooks the draft's tap layers that live on it; taps of earlier stages reach the last stage
through ``kernels.transport.TapChannel`` (``repro.parallel.taps.TapRouter``), outside the schedule.
The last stage's loss per microbatch is GRPO's clipped loss (normalised by the global token count,
so microbatches sum to the full-batch loss) plus ``lambda`` times the draft's loss on the shipped
(detached) taps. The policy's gradient norm is reduced across stages before clipping, the draft is
clipped on its own; then each rank steps AdamW on its parameters, exactly as ``JointUpdate`` does in
one process (tests/rl/test_pp.py checks that the two give the same clipped gradients).

The batch travels as one float64 ``target`` tensor ``[B, T, 4]`` = (token id, loss mask, rollout
log-prob, advantage), which the schedule splits into microbatches like the input ids.

    from kernels.launch import spawn
    out = spawn(pp_update_worker, 2, args=(payload,))      # payload: see make_payload
"""
from __future__ import annotations

import time

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from kernels.transport import ChannelLayout, TapChannel
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.parallel.harness import LastStage
from repro.parallel.model import build_stages, split_layers, stage_of_tap
from repro.parallel.taps import TapRouter
from repro.rl.config import RunConfig
from repro.rl.dist_parts import (
    clip_across,
    read_remote_taps,
    release_after_backward,
    stage_to_hf,
    tap_sources,
)
from repro.rl.drafts import build_draft, trainable_parameters
from repro.rl.episodes import RolloutBatch
from repro.rl.grpo import clipped_policy_loss, token_logprobs
from repro.rl.joint import draft_loss_mask, joint_optimizer, set_draft_lr
from repro.rl.warmstart import make_policy


def make_payload(cfg: RunConfig, policy, draft, batch: RolloutBatch, advantages: torch.Tensor, *,
                 n_microbatches: int, mask_token_id: int, transport: str = "shm",
                 anchor_seed: int = 0) -> dict:
    """Everything a rank needs, picklable: config, weights, the batch, the schedule's microbatch count
    (``repro.rl.mesh_update`` also reads the attention mask and the draft's anchor seed)."""
    B = batch.size
    if B % n_microbatches:
        raise ValueError(f"batch of {B} sequences does not split into {n_microbatches} microbatches")
    return {"cfg": cfg.to_dict(), "policy": {k: v.clone() for k, v in policy.model.state_dict().items()},
            "draft": None if draft is None else {k: v.clone() for k, v in draft.state_dict().items()},
            "ids": batch.input_ids, "mask": batch.loss_mask, "old": batch.rollout_logp, "adv": advantages,
            "att": batch.attention_mask, "n_mb": n_microbatches, "mask_token_id": mask_token_id,
            "transport": transport, "anchor_seed": anchor_seed}


def pp_update_worker(rank: int, world: int, payload: dict) -> dict:
    """One rank of a PP=world joint update; returns its updated parameters (HF names) and tap stats."""
    cfg = RunConfig.from_dict(payload["cfg"]).validate()
    n_mb = payload["n_mb"]
    ids, mask, old, adv = payload["ids"], payload["mask"], payload["old"], payload["adv"]
    B, T = ids.shape
    mb = B // n_mb
    policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=torch.float32, device="cpu")
    policy.model.load_state_dict(payload["policy"])
    draft = None
    if cfg.draft is not None:
        draft = build_draft(cfg.draft, policy, mask_token_id=payload["mask_token_id"], train=True)
        draft.load_state_dict(payload["draft"])
    H, L = policy.hidden_size, policy.num_layers
    ranges = split_layers(L, world)
    stage = build_stages(policy.model, world)[rank]
    last = world - 1
    taps = {t: stage_of_tap(t, ranges) for t in (draft.tap_layers if draft is not None else ())}
    sources = tap_sources(taps, last, mb * T, H)
    layout = ChannelLayout(sources=sources, stage_to_rank={s: s for s in range(world)}, consumer_rank=last,
                           ring_depth=n_mb) if sources else None
    channel = (TapChannel.setup(layout, payload["transport"], get_timeout_s=60, put_timeout_s=60)
               if layout else None)
    router = TapRouter(channel, n_mb, draft_stage=last)
    h_ex = torch.zeros(mb, T, H, requires_grad=True)
    inp = torch.zeros(mb, T, dtype=torch.long) if rank == 0 else h_ex
    out_ex = torch.zeros(mb, T, policy.vocab_size, requires_grad=True) if rank == last else h_ex
    # the draft is a sub-module of the last stage (its parameters are reached by every schedule's backward)
    module = LastStage(stage, draft) if rank == last and draft is not None else stage
    pipe = PipelineStage(module, rank, world, torch.device("cpu"), input_args=(inp,), output_args=(out_ex,))
    router.track(rank, pipe)
    for t, s in taps.items():
        if s == rank:
            router.hook(rank, stage.embed_tokens if t == -1 else stage.layers[str(t)], t)
    n_tok = float(mask.sum())
    lam = cfg.draft.loss_weight if cfg.draft is not None else 0.0
    gen = torch.Generator().manual_seed(payload.get("anchor_seed", 0))
    tap_wait = 0.0
    stats = {"policy_loss": 0.0, "draft_loss": 0.0}

    def loss_fn(logits, target):
        nonlocal tap_wait
        t_ids, t_mask, t_old, t_adv = target[..., 0].long(), target[..., 1].float(), target[..., 2].float(), \
            target[..., 3][:, 0].float()
        lp = token_logprobs(logits, t_ids, cfg.grpo.temperature)
        loss, _ = clipped_policy_loss(lp, t_old, t_adv, t_mask, n_tok, cfg.grpo.clip_eps)
        stats["policy_loss"] += float(loss.detach())
        if draft is None:
            return loss
        seq = router.seq(last)
        feats = dict(router.local.pop(seq, {}))
        if channel is not None:
            remote, waited = read_remote_taps(channel, layout.sources, seq, tuple(t_ids.shape))
            feats.update(remote)
            tap_wait += waited
        dbatch = DraftBatch(t_ids, draft_loss_mask(t_mask), logits.detach(), extras={"anchor_generator": gen})
        dl = draft.draft_loss(TargetFeatures(feats), dbatch)
        stats["draft_loss"] += float(dl.detach()) / n_mb
        return loss + lam * dl / n_mb

    if channel is not None and rank == last:
        release_after_backward(pipe, channel, layout.sources, lambda: router.step, n_mb)

    params = [p for p in stage.parameters() if p.requires_grad]
    dparams = trainable_parameters(draft) if draft is not None and rank == last else []
    opt = joint_optimizer(params, dparams, cfg.grpo, cfg.draft)
    schedule = Schedule1F1B(pipe, n_mb, loss_fn=loss_fn, scale_grads=False)
    target = torch.stack([ids.double(), mask.double(), old.double(), adv.double()[:, None].expand(B, T)],
                         dim=-1)
    t0 = time.perf_counter()
    last_kwargs = {"target": target, "losses": []} if rank == last else {}
    schedule.step(*((ids,) if rank == 0 else ()), **last_kwargs)
    if channel is not None:
        channel.flush()
    # the policy's grad norm spans every stage: reduce the squared norms before clipping
    norm = clip_across(params, cfg.grpo.max_grad_norm, torch.distributed.group.WORLD)
    if dparams:
        torch.nn.utils.clip_grad_norm_(dparams, cfg.draft.max_grad_norm)
    grads = {stage_to_hf(n): p.grad.detach().clone() for n, p in stage.named_parameters()
             if p.grad is not None}
    dgrads = {n: p.grad.detach().clone() for n, p in draft.named_parameters() if p.grad is not None} \
        if dparams else {}
    set_draft_lr(opt, cfg.draft)
    opt.step()
    update_s = time.perf_counter() - t0
    if channel is not None:
        channel.close()
    router.remove()
    out = {stage_to_hf(n): p.detach().clone() for n, p in stage.named_parameters()}
    return {"rank": rank, "policy": out, "grads": grads, "draft_grads": dgrads, "policy_grad_norm": norm,
            "update_time_s": update_s,
            "draft": ({k: v.clone() for k, v in draft.state_dict().items()}
                      if draft is not None and rank == last else None),
            "tap_wait_s": tap_wait if rank == last else 0.0, "stats": stats}


def pp_probe_worker(rank: int, world: int, payloads: list[dict]) -> list[dict]:
    """Several independent PP joint updates in one process group (one per payload), for timing probes."""
    return [pp_update_worker(rank, world, p) for p in payloads]


def probe_tap_wait(trainer, *, stages: int = 2, updates: int = 3, microbatches: int = 4,
                   transport: str = "shm", timeout_s: float = 600.0) -> list[dict]:
    """Tap wait and update time of ``updates`` joint updates under PP=``stages`` from ``trainer``'s state.

    Each update runs on a fresh rollout batch drawn after the run's training steps, from the trainer's
    current policy and draft (optimizer state fresh: this measures the update, it does not train).
    Returns per update: the draft stage's total wait for taps and the slowest stage's update time.
    """
    from kernels.launch import spawn
    from repro.rl.grpo import group_advantages
    cfg = trainer.cfg
    if cfg.draft is None:
        raise ValueError("probe_tap_wait needs a draft: the tap channel only runs for drafted rows")
    payloads = []
    for i in range(updates):
        batch = trainer.rollout(cfg.steps + i)
        adv = group_advantages(batch.rewards, cfg.grpo.generations_per_prompt, cfg.grpo.normalize_std)
        payloads.append(make_payload(cfg, trainer.policy, trainer.draft, batch, adv,
                                     n_microbatches=microbatches, mask_token_id=trainer.tok.mask_id,
                                     transport=transport))
    ranks = spawn(pp_probe_worker, stages, args=(payloads,), timeout_s=timeout_s)
    return [{"tap_wait_s": ranks[-1][i]["tap_wait_s"],
             "update_time_s": max(r[i]["update_time_s"] for r in ranks),
             "draft_loss": ranks[-1][i]["stats"]["draft_loss"]} for i in range(updates)]
