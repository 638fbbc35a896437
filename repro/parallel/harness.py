"""The PP harness: a Qwen3 policy split into pipeline stages, run by torch.distributed.pipelining
schedules, with the draft on the last stage fed by TapChannel beside the schedule.

Per rank: build the same random policy (same seed), cut it into ``pp * stages_per_rank`` stages,
keep this rank's stages, hook the draft's tap layers, and run ``steps`` training steps of
``n_microbatches`` microbatches. The last stage's loss per microbatch is
``L_policy + lambda * L_draft`` where the draft reads its features from the channel just before its
forward of that microbatch and releases them after that microbatch's backward (weight backward under
zero-bubble schedules). With ``draft=False`` the channel and hooks are off and the loss is L_policy.
``transport="inschedule"`` is the negative control: taps go by blocking send/recv on the pipeline's
own group from inside the forward (NeMo-RL's ``_gather_distributed`` today), where they are matched
against the schedule's own activation messages.

Schedules (placement): ``1f1b`` (one stage per rank), ``interleaved1f1b`` (loop: stage s on rank
s % pp), ``zbv`` (V: rank r holds stages r and 2pp-1-r). CPU runs use gloo and static shapes.

    from kernels.launch import spawn
    from repro.parallel.harness import PPConfig, run_pp_worker
    out = spawn(run_pp_worker, 4, args=(PPConfig(pp=4, schedule="1f1b"),))

    python -m repro.parallel.harness --pp 4 --schedule zbv     # prints the per-microbatch tap report
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.distributed.pipelining import PipelineStage

from kernels.transport import ChannelLayout, TapChannel, TapSpec, sequence_stamp
from repro.parallel.draft_interface import DraftBatch, TapDraft, TargetFeatures
from repro.parallel.eagle_draft import TinyEagleDraft
from repro.parallel.model import build_policy, build_stages, split_layers, stage_of_tap, tiny_qwen3_config
from repro.parallel.taps import TapRouter, tap_name

# name -> (torch.distributed.pipelining class, stages per rank, placement); a class the installed torch
# lacks is refused with a clear error when asked for, not at import.
SCHEDULES = {"1f1b": ("Schedule1F1B", 1, "loop"), "interleaved1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
             "zbv": ("ScheduleZBVZeroBubble", 2, "v")}


def schedule_class(name: str):
    cls_name = SCHEDULES[name][0]
    cls = getattr(pipelining, cls_name, None)
    if cls is None:
        raise RuntimeError(f"schedule {name!r} needs torch.distributed.pipelining.{cls_name}, which torch "
                           f"{torch.__version__} does not provide")
    return cls


def check_placement_backend(name: str, backend: str, version: str = str(torch.__version__)) -> None:
    """Refuse a V placement (two consecutive stages on one rank) over gloo on a torch before 2.12: its schedules'
    warm-up sends each stage's neighbour a message, the same rank's included, and gloo has no channel to itself
    ("Pair is not connected"); torch 2.12 warms up without self-sends. NCCL sends to itself."""
    if SCHEDULES[name][2] == "v" and backend == "gloo" and torch.torch_version.TorchVersion(version) < (2, 12):
        raise RuntimeError(f"schedule {name!r} over gloo needs torch >= 2.12 (installed: {version}): torch's "
                           "pipelining before 2.12 sends to the rank itself when it warms up the V placement's "
                           "stages, which gloo cannot; use 1f1b or interleaved1f1b, or a newer torch")


@dataclass(frozen=True)
class PPConfig:
    pp: int = 2
    schedule: str = "1f1b"
    n_microbatches: int = 4
    mb_size: int = 1
    seq_len: int = 16
    steps: int = 2
    draft: bool = True
    lam: float = 0.1
    transport: str = "shm"  # TapChannel transport, or "inschedule" (negative control, see below)
    ring_depth: int | None = None  # default: n_microbatches
    seed: int = 0
    model: dict = field(default_factory=dict)  # tiny_qwen3_config overrides

    def __post_init__(self) -> None:
        if self.transport == "inschedule" and self.schedule != "1f1b":
            raise ValueError("transport 'inschedule' (the negative control) is wired for schedule "
                             "'1f1b' only")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}: expected one of {sorted(SCHEDULES)}")
        if self.pp < 2:
            raise ValueError(f"pp={self.pp}: the harness needs at least 2 pipeline ranks")
        if self.n_microbatches < 1 or self.mb_size < 1 or self.seq_len < 3:
            raise ValueError(f"n_microbatches={self.n_microbatches}, mb_size={self.mb_size}, "
                             f"seq_len={self.seq_len}: expected >= 1, >= 1, >= 3")

    @property
    def num_stages(self) -> int:
        return self.pp * SCHEDULES[self.schedule][1]

    def stage_to_rank(self) -> dict[int, int]:
        placement, n, p = SCHEDULES[self.schedule][2], self.num_stages, self.pp
        if placement == "loop":
            return {s: s % p for s in range(n)}
        return {s: (s if s < p else 2 * p - 1 - s) for s in range(n)}


def step_batch(cfg: PPConfig, vocab: int, step: int) -> torch.Tensor:
    """The token batch of ``step``: [n_microbatches * mb_size, seq_len], the same on every rank."""
    g = torch.Generator().manual_seed(1000 * cfg.seed + step)
    return torch.randint(0, vocab, (cfg.n_microbatches * cfg.mb_size, cfg.seq_len), generator=g)


def policy_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of the policy on its own microbatch (the stand-in for L_RL)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


class LastStage(nn.Module):
    """The last policy stage with the draft as a sub-module (so every schedule's weight backward
    reaches the draft's parameters); the draft runs in the loss, not in ``forward``."""

    def __init__(self, stage: nn.Module, draft: nn.Module | None):
        super().__init__()
        self.stage, self.draft = stage, draft

    def forward(self, x):
        return self.stage(x)


def build(cfg: PPConfig):
    """Policy config, all stage modules, the draft (or None), layer ranges and tap->stage map."""
    mcfg = tiny_qwen3_config(**cfg.model)
    policy = build_policy(mcfg, cfg.seed)
    ranges = split_layers(mcfg.num_hidden_layers, cfg.num_stages)
    stages = build_stages(policy, cfg.num_stages)
    draft = TinyEagleDraft(mcfg, seed=cfg.seed + 1) if cfg.draft else None
    if draft is not None and not isinstance(draft, TapDraft):
        raise TypeError(f"{type(draft).__name__} does not satisfy the TapDraft protocol")
    taps = {t: stage_of_tap(t, ranges) for t in (draft.tap_layers if draft else ())}
    return mcfg, stages, draft, ranges, taps


def channel_layout(cfg: PPConfig, taps: dict[int, int], hidden: int) -> ChannelLayout | None:
    last = cfg.num_stages - 1
    sources: dict[int, list[TapSpec]] = {}
    for tap, stage in sorted(taps.items()):
        if stage != last:
            sources.setdefault(stage, []).append(TapSpec(tap_name(tap), (cfg.mb_size * cfg.seq_len, hidden)))
    if not sources:
        return None
    s2r = cfg.stage_to_rank()
    return ChannelLayout(sources=sources, stage_to_rank=s2r, consumer_rank=s2r[last],
                         ring_depth=cfg.ring_depth or cfg.n_microbatches)


def run_pp_worker(rank: int, world: int, cfg: PPConfig) -> dict:
    """One rank of a PP run (call under kernels.launch.spawn with world == cfg.pp)."""
    if world != cfg.pp:
        raise ValueError(f"world size {world} != cfg.pp {cfg.pp}")
    check_placement_backend(cfg.schedule, dist.get_backend())
    torch.manual_seed(cfg.seed)
    mcfg, stages, draft, _ranges, taps = build(cfg)
    last = cfg.num_stages - 1
    s2r = cfg.stage_to_rank()
    mine = [s for s in range(cfg.num_stages) if s2r[s] == rank]
    layout = channel_layout(cfg, taps, mcfg.hidden_size) if cfg.draft else None
    inschedule = cfg.transport == "inschedule"
    channel = (TapChannel.setup(layout, cfg.transport, get_timeout_s=60, put_timeout_s=60)
               if layout and not inschedule else None)
    router = TapRouter(channel, cfg.n_microbatches, draft_stage=last,
                       inschedule_dst=s2r[last] if inschedule and layout else None)
    modules, pipe_stages = {}, []
    mb_shape = (cfg.mb_size, cfg.seq_len)
    # Static stage metadata; requires_grad on the examples tells the stage that activations carry
    # gradients (metadata taken from tensors without it silently cut the backward between stages).
    h_ex = torch.zeros(*mb_shape, mcfg.hidden_size, requires_grad=True)
    for s in mine:
        mod = LastStage(stages[s], draft) if s == last else stages[s]
        modules[s] = mod
        inp = torch.zeros(*mb_shape, dtype=torch.long) if s == 0 else h_ex
        out = torch.zeros(*mb_shape, mcfg.vocab_size, requires_grad=True) if s == last else h_ex
        ps = PipelineStage(mod, s, cfg.num_stages, torch.device("cpu"), input_args=(inp,), output_args=(out,))
        pipe_stages.append(ps)
        router.track(s, ps)
        pol = stages[s]
        for tap, owner in taps.items():
            if owner != s:
                continue
            router.hook(s, pol.embed_tokens if tap == -1 else pol.layers[str(tap)], tap)

    per_mb: list[dict] = []

    def loss_fn(logits, ids):
        seq = router.seq(last)
        lp = policy_loss(logits, ids)
        row = {"step": router.step, "mb": router.current[last], "seq": seq, "policy_loss": lp.item()}
        if draft is None:
            per_mb.append(row)
            return lp
        feats = dict(router.local.pop(seq, {}))
        if inschedule and layout is not None:  # negative control: blocking recv on the pipeline's group
            for stage, specs in layout.sources.items():
                for spec in specs:
                    if s2r[stage] != rank:
                        buf = torch.empty(*ids.shape, mcfg.hidden_size)
                        dist.recv(buf, src=s2r[stage])
                        feats[-1 if spec.name == "embed" else int(spec.name[1:])] = buf
        if channel is not None:
            for stage in layout.sources:
                for name, t in channel.get_stage(stage, seq).items():
                    tap = -1 if name == "embed" else int(name[1:])
                    feats[tap] = t.view(*ids.shape, -1)
        dbatch = DraftBatch(ids, torch.ones_like(ids, dtype=torch.float32), logits.detach())
        dl = draft.draft_loss(TargetFeatures(feats), dbatch)
        row["draft_loss"] = dl.item()
        row["taps"] = {t: v.clone() for t, v in feats.items()}
        per_mb.append(row)
        return lp + cfg.lam * dl

    if channel is not None and last in mine:
        last_pipe = next(p for p in pipe_stages if p.stage_index == last)
        _release_after_backward(last_pipe, channel, layout, router)

    sched_cls, per_rank = schedule_class(cfg.schedule), SCHEDULES[cfg.schedule][1]
    stage_arg = pipe_stages[0] if per_rank == 1 else pipe_stages
    schedule = sched_cls(stage_arg, cfg.n_microbatches, loss_fn=loss_fn, scale_grads=False)
    for step in range(cfg.steps):
        router.step = step
        batch = step_batch(cfg, mcfg.vocab_size, step)
        args = (batch,) if 0 in mine else ()
        kwargs = {"target": batch, "losses": []} if last in mine else {}
        schedule.step(*args, **kwargs)
    if channel is not None:
        channel.flush()
    grads = {f"stage{s}.{n}": p.grad.clone() for s in mine for n, p in stages[s].named_parameters()
             if p.grad is not None}
    if draft is not None and last in mine:
        grads.update({f"draft.{n}": p.grad.clone() for n, p in draft.named_parameters()
                      if p.grad is not None})
    report = channel_report(channel, cfg) if channel is not None and rank == layout.consumer_rank else []
    if channel is not None:
        channel.close()
    router.remove()
    return {"rank": rank, "per_mb": per_mb, "grads": grads, "tap_report": report, "config": asdict(cfg)}


def _release_after_backward(pipe_stage, channel: TapChannel, layout: ChannelLayout,
                            router: TapRouter) -> None:
    """Release a microbatch's slots once nothing can read them: after its full backward, or after
    its weight backward when the schedule splits backward (zero bubble)."""
    full, weight = pipe_stage.backward_one_chunk, pipe_stage.backward_weight_one_chunk

    def release(mb: int) -> None:
        seq = sequence_stamp(router.step, mb, router.n_mb)
        for stage in layout.sources:
            channel.release(stage, seq)

    def backward_one_chunk(bwd_chunk_id, *args, **kwargs):
        out = full(bwd_chunk_id, *args, **kwargs)
        if kwargs.get("full_backward", args[1] if len(args) > 1 else True):
            release(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs):
        out = weight(bwd_chunk_id, *args, **kwargs)
        release(bwd_chunk_id)
        return out

    pipe_stage.backward_one_chunk = backward_one_chunk
    pipe_stage.backward_weight_one_chunk = backward_weight_one_chunk


def channel_report(channel: TapChannel, cfg: PPConfig) -> list[dict]:
    """Per microbatch on the draft's rank: tap wait, transfer time, bytes, slack per source stage."""
    rows: dict[int, dict] = {}
    for g in channel.stats.gets:
        r = rows.setdefault(g["seq"], {"seq": g["seq"], "step": g["seq"] // cfg.n_microbatches,
                                       "mb": g["seq"] % cfg.n_microbatches, "bytes": 0, "tap_wait_s": 0.0,
                                       "transfer_s_max": 0.0, "slack_s": {}})
        r["bytes"] += g["bytes"]
        r["tap_wait_s"] += g["wait_s"]
        r["transfer_s_max"] = max(r["transfer_s_max"], g["transfer_s"])
        r["slack_s"][g["stage"]] = min(r["slack_s"].get(g["stage"], float("inf")), g["slack_s"])
    return [rows[k] for k in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    """Run the harness on CPU (gloo) and print the per-microbatch tap report of the draft's rank."""
    import argparse

    from kernels.launch import spawn

    ap = argparse.ArgumentParser(
        description="PP harness with TapChannel on CPU; prints the per-microbatch report.")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    ap.add_argument("--transport", default="shm", help="shm | gloo | host_staging")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    cfg = PPConfig(pp=args.pp, schedule=args.schedule, transport=args.transport,
                   n_microbatches=args.microbatches, steps=args.steps)
    outs = spawn(run_pp_worker, cfg.pp, args=(cfg,), timeout_s=600)
    report = next(o["tap_report"] for o in outs if o["tap_report"])
    losses = {r["seq"]: r for o in outs for r in o["per_mb"]}
    print(f"{'step':>4} {'mb':>3} {'bytes':>8} {'tap wait ms':>11} {'transfer ms':>11}  slack ms by source "
          "stage   policy loss  draft loss")
    for r in report:
        slack = " ".join(f"{s}:{v * 1e3:.2f}" for s, v in sorted(r["slack_s"].items()))
        lr = losses[r["seq"]]
        print(f"{r['step']:>4} {r['mb']:>3} {r['bytes']:>8} {r['tap_wait_s'] * 1e3:>11.3f} "
              f"{r['transfer_s_max'] * 1e3:>11.3f}  {slack:<26} {lr['policy_loss']:>11.5f} "
              f"{lr['draft_loss']:>11.5f}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
