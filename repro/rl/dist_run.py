"""Run one co-training row distributed, under torchrun: the PP x CP joint update on every rank, rollout on
rank 0.

    torchrun --standalone --nproc-per-node 4 -m repro.rl.dist_run --artifact table1 --row "Qwen3-8B/DFlash" \\
        --profile cpu-tiny --pp 2 --cp 2 --microbatch 4 --out results/cpu-2c/cpu-tiny/dist/dense-dflash-pp2cp2

World rank ``p * cp + c`` runs pipeline stage ``p`` on CP shard ``c`` (``repro.rl.mesh_update``). Rank 0
also hosts the suite's rollout engine (colocated, as ``repro.rl.run`` does in one process): it
generates the step's batch, which is broadcast; every rank takes part in the joint GRPO + draft
update; the updated policy and draft are gathered to rank 0 and pushed into the engine; rank 0 logs
one metrics row per step through ``MetricsLogger`` with ``repro.rl.run``'s metric names plus
``train/tap_wait_s`` (the draft stage's wait for taps of earlier stages, max over its CP ranks) and
``train/weight_gather_s``. Update times and CPU seconds are the slowest rank's. On a GPU the update
computes in the profile's dtype under autocast over fp32 weights, as the single-process update does
(``--update-dtype float32`` keeps it in fp32). The run is labelled artifact ``dist`` (its config keeps the
row's artifact), so it never enters that artifact's summaries.

Everything is validated before a process group or a model exists (``pp * cp`` = world size, layers
per stage, microbatches for 1F1B, the profile's engine, the run folder); a bad value exits with code 2
and a message naming it. Not supported yet: a KL-to-reference penalty, TP/EP.

Every ``ckpt_every`` steps each rank writes its part of the update and rank 0 commits them
(``repro.rl.dist_checkpoint``). On SIGINT or SIGTERM to any rank (``timeout``, a scheduler's preemption notice,
Snakemake stopping its jobs; torchrun forwards one it gets) every rank finishes the step in flight, the state after
it is checkpointed and the ranks exit 128 + the signal's number (``repro.rl.stop``; a second signal, two seconds
or more after the first, stops at once). torchrun kills its workers 30 s after forwarding a signal, so a longer
step is lost and the run continues from its last periodic checkpoint. The same command run again, with the same
layout, continues after the last checkpoint; a folder holding only a killed run's metrics starts over.

A paper profile (``engine: nemo-rl``) runs here with ``--engine suite --checkpoint-root /path``: its
``rl:`` section's policies load the real checkpoints (every rank loads its copy, rank 0 also the
rollout copy), the workloads use the checkpoint's tokenizer, and ``--pp``/``--cp`` default to the
policy's ``mesh:`` suggestion.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from repro.core.io import write_json_atomic
from repro.core.metrics import MetricsLogger
from repro.core.profile import ProfileError
from repro.core.specs import ARTIFACTS, ConfigError, read_checkpoint_config
from repro.models.policy import policy_config
from repro.rl.config import (
    ENGINES,
    RunConfig,
    check_engine,
    load_run_profile,
    policy_mesh,
    run_config_from_profile,
)
from repro.rl.dist_checkpoint import commit, drop, load_rank, resumable_step, save_rank
from repro.rl.grpo import group_advantages
from repro.rl.mesh_update import Mesh, MeshShape, MeshUpdate
from repro.rl.run import RESTART_HELP
from repro.rl.stop import StopOnSignal, say
from repro.rl.trainer import CoTrainer, checkpoint_due, step_metrics

DIST_ARTIFACT = "dist"       # MetricsLogger's artifact label of these runs (results/<hw>/<profile>/dist/...)
TRANSPORTS = ("auto", "shm", "host_staging", "gloo", "p2p", "cuda_ipc")
CROSS_NODE_TRANSPORTS = ("gloo", "p2p")     # the others share memory, so serve the ranks of one node
EXAMPLES = """examples:
  # cpu-tiny row, 2 pipeline stages x 2 CP shards on one machine (gloo, taps over shared memory)
  torchrun --standalone --nproc-per-node 4 -m repro.rl.dist_run --artifact table1 --row "Qwen3-8B/EAGLE-3" \\
      --profile cpu-tiny --pp 2 --cp 2 --microbatch 4 --steps 4 --out /tmp/dist-eagle3
  # several nodes (one torchrun per node, e.g. from srun): same arguments, a shared rendezvous; a drafted
  # row whose pipelines (ranks p * cp + c, p = 0..pp-1) span nodes sends its taps with --tap-transport p2p
  srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
      --rdzv-endpoint $HEAD:29500 -m repro.rl.dist_run --artifact table1 --row ... --pp 1 --cp 16 --out ...
  # a paper profile's row without NeMo-RL: the real checkpoint, the layout of rl.policies.<p>.mesh
  # (PP=4 x CP=2)
  torchrun --standalone --nproc-per-node 8 -m repro.rl.dist_run --artifact table1 --row "Qwen3-8B/DFlash" \\
      --profile paper-h100 --engine suite --checkpoint-root /ckpt --out ...
"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m repro.rl.dist_run", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS)
    ap.add_argument("--row", required=True, help="row label (a key of <artifact>.rows in the profile)")
    ap.add_argument("--profile", default="cpu-tiny",
                    help="experiments/profiles/<name>.yaml (engine: suite), or a path to a profile "
                         ".yaml file")
    ap.add_argument("--engine", choices=ENGINES, default=None,
                    help="suite: run an engine: nemo-rl profile's row on the suite's own engine "
                         "(its rl: section)")
    ap.add_argument("--checkpoint-root", default="",
                    help="folder holding the profile's checkpoints: (policies with a checkpoint key)")
    ap.add_argument("--out", required=True,
                    help="run folder: a new one, or an unfinished run's, which continues after its last checkpoint")
    ap.add_argument("--pp", type=int, default=0,
                    help="pipeline stages (the draft lives on the last); 0: the policy's rl mesh suggestion")
    ap.add_argument("--cp", type=int, default=0,
                    help="context-parallel shards per stage (zigzag ring); 0: the policy's rl "
                         "mesh suggestion")
    ap.add_argument("--microbatch", type=int, default=0,
                    help="sequences per microbatch (0: the profile's grpo.microbatch); 1F1B needs "
                         ">= pp microbatches")
    ap.add_argument("--steps", type=int, default=0, help="training steps (0: the profile's)")
    ap.add_argument("--warm-start", default="",
                    help="SFT warm-start folder (repro.rl.sft); empty: random init")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sampling-seed", type=int, default=None,
                    help="seed of sampling only (a baseline replica, as repro.rl.run's); default: --seed")
    ap.add_argument("--tap-transport", default="auto", choices=TRANSPORTS,
                    help="TapChannel transport (auto: shm on CPU, cuda_ipc on GPUs of one node; p2p: "
                         "torch.distributed point-to-point, gloo on CPU and NCCL on GPUs, across nodes)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads per rank (0: torch's default)")
    ap.add_argument("--update-dtype", choices=("auto", "float32"), default="auto",
                    help="compute dtype of the update's forward passes: auto = the profile's dtype under "
                         "autocast on a GPU (as repro.rl.run's update), fp32 on a CPU; float32 = fp32 "
                         "everywhere (the ring then takes the fp32 fallback kernel)")
    ap.add_argument("--log-artifact", choices=("dist", "artifact"), default="dist",
                    help="artifact label of the logged run: 'dist' (default) keeps it out of the "
                         "single-process artifact's tables; 'artifact' logs it as --artifact's own run "
                         "(the workflow's paper profiles on the suite engine, where torchrun is how every "
                         "row runs)")
    ap.add_argument("--restart-on-config-change", action="store_true", help=RESTART_HELP)
    return ap.parse_args(argv)


def build_config(args: argparse.Namespace, world: int) -> tuple[RunConfig, MeshShape, int]:
    """The run's config and mesh, validated (ConfigError/ProfileError name the bad value)."""
    prof = load_run_profile(args.profile)
    check_engine(prof, args.engine, args.artifact, "torchrun ... -m repro.rl.dist_run")
    cfg = run_config_from_profile(prof, args.artifact, args.row, out=args.out, seed=args.seed,
                                  warm_start=args.warm_start, checkpoint_root=args.checkpoint_root or None,
                                  sampling_seed=args.sampling_seed)
    if not args.pp or not args.cp:
        mesh = policy_mesh(prof, args.artifact, args.row) or {}
        if not mesh:
            raise ConfigError(f"config --pp={args.pp} / --cp={args.cp} is invalid: the row's policy has no "
                              "rl.policies.<name>.mesh suggestion; expected both --pp and --cp")
        args.pp, args.cp = args.pp or int(mesh["pp"]), args.cp or int(mesh["cp"])
    if args.steps < 0 or args.microbatch < 0:
        raise ConfigError(f"config --steps={args.steps} / --microbatch={args.microbatch} is invalid: "
                          "expected >= 0 (0 keeps the profile's value)")
    if args.steps:
        cfg.steps = args.steps
    if args.microbatch:
        cfg.grpo.microbatch = args.microbatch
    if cfg.draft is not None and (cfg.draft.microbatch or cfg.draft.cuda_graph):
        # both shape repro.rl.joint's deferred draft pass (single process); the mesh update has none: the
        # draft trains inside the last stage's microbatches, so the profile's values do not apply here
        print(f"dist_run: draft.microbatch={cfg.draft.microbatch} and "
              f"draft.cuda_graph={cfg.draft.cuda_graph} configure the single-process update's deferred "
              "draft pass; under PP x CP the draft trains in the last stage's microbatches: using "
              "draft.microbatch=0, draft.cuda_graph=false", file=sys.stderr)
        cfg.draft.microbatch, cfg.draft.cuda_graph = 0, False
    if cfg.grpo.compile_layers:
        print("dist_run: grpo.compile_layers=true compiles the single-process update's forward; the PP x CP "
              "update runs its stages eagerly: using grpo.compile_layers=false", file=sys.stderr)
        cfg.grpo.compile_layers = False
    cfg.validate()
    shape = MeshShape(args.pp, args.cp)
    if cfg.policy.checkpoint:
        layers = int(read_checkpoint_config(cfg.policy.path)["num_hidden_layers"])
    else:
        layers = policy_config(cfg.policy.family, cfg.policy.scale, vocab_size=cfg.vocab_size,
                               **cfg.policy.overrides).num_hidden_layers
    n_mb = shape.check(world, cfg, layers)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"config device={cfg.device!r} is invalid here: profile {args.profile!r} needs "
                          "GPUs, torch sees none")
    transport = tap_transport(args.tap_transport, cfg.device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cfg.draft is not None and shape.pp > 1 and transport not in CROSS_NODE_TRANSPORTS:
        for c in range(shape.cp):
            nodes = sorted({shape.rank_of(p, c) // local_world for p in range(shape.pp)})
            if len(nodes) > 1:
                raise ConfigError(f"config --tap-transport={transport!r} is invalid for pp={shape.pp} x "
                                  f"cp={shape.cp} on nodes of {local_world} ranks: the pipeline of CP shard "
                                  f"{c} spans nodes {nodes}, and {transport} serves one node; expected "
                                  f"pp*cp <= {local_world} (or --tap-transport p2p)")
    if (Path(args.out) / "run.json").exists():
        raise ConfigError(f"config out={args.out!r} is invalid: it holds a finished run (run.json); expected a new "
                          "folder or an unfinished run's")
    return cfg, shape, n_mb


def tap_transport(name: str, device: str) -> str:
    if name != "auto":
        return name
    return "cuda_ipc" if device.startswith("cuda") else "shm"


class MeshStop:
    """``StopOnSignal`` agreed across the ranks: ``requested`` is true on every rank once any rank got a signal. A
    collective: every rank reads it exactly once after each step (``CoTrainer.run`` does on rank 0)."""

    def __init__(self, stop: StopOnSignal, device: str):
        self.stop, self.device, self.signum = stop, device, 0

    @property
    def requested(self) -> bool:
        flag = torch.tensor([self.stop.signum or 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signum = int(flag.item())
        return self.signum != 0

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def cut_short(self, done: int, steps: int) -> bool:
        """Whether the agreed stop ended the run before its last step (``done``: the last step run)."""
        return self.signum != 0 and done != steps - 1


class DistCoTrainer(CoTrainer):
    """Rank 0's loop: ``CoTrainer``'s rollout, validation, weight push and logging around the mesh update."""

    def attach(self, mesh_update: MeshUpdate, layout: dict[str, int]) -> None:
        self.mesh_update, self.layout = mesh_update, layout

    def train_step(self, step: int):
        t0, c0 = time.perf_counter(), time.process_time()
        batch = self.rollout(step)
        c1 = time.process_time()
        grpo = self.cfg.grpo
        adv = group_advantages(batch.rewards, grpo.generations_per_prompt, grpo.normalize_std)
        stats = follower_step(self.mesh_update, self.cfg, step, (batch, adv))
        tg, cg = time.perf_counter(), time.process_time()
        policy, draft = self.mesh_update.gather_to_root()
        load_weights(self.policy.model, policy)
        if self.draft is not None:
            load_weights(self.draft, draft)
        gather_s = time.perf_counter() - tg
        push_s, _ = self.push()
        step_time = time.perf_counter() - t0
        rollout_cpu = (c1 - c0) + batch.tool_time_s
        push_cpu = time.process_time() - cg
        m = step_metrics(self.cfg, batch, stats, push_s=gather_s + push_s, step_time=step_time,
                         rollout_cpu=rollout_cpu, update_cpu=stats.update_cpu_s,
                         step_cpu=rollout_cpu + stats.update_cpu_s + push_cpu)
        m["train/tap_wait_s"] = stats.tap_wait_s
        m["train/weight_gather_s"] = gather_s
        return m, batch, stats

    def save(self, step: int) -> None:
        """Collective with the other ranks' ``save_part`` of the same step (``follow``): every rank's part is
        written, then rank 0 commits them."""
        save_part(self.mesh_update, self.cfg, step)
        commit(self.cfg.out, step, self.layout, self.cfg.to_dict(), self.warm_digest)
        self.saved_step = step


def resume(upd: MeshUpdate, trainer: DistCoTrainer | None, args: argparse.Namespace, cfg: RunConfig,
           layout: dict[str, int]) -> int:
    """Collective: the first step to run. With a checkpoint to continue, every rank loads its part of it and rank 0's
    trainer takes the gathered weights into its engine. A checkpoint that is refused raises ConfigError on every
    rank."""
    rank, box = dist.get_rank(), [None]
    if rank == 0:
        try:
            box = [resumable_step(args.out, layout, cfg.to_dict(), trainer.warm_digest, args.restart_on_config_change)]
        except ConfigError as exc:
            box = [str(exc)]
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise ConfigError(box[0])
    if box[0] is None:
        return 0
    step = box[0]
    upd.load_state_dict(load_rank(args.out, step, rank))
    gathered = upd.gather_to_root()
    if rank == 0:
        load_weights(trainer.policy.model, gathered[0])
        if trainer.draft is not None:
            load_weights(trainer.draft, gathered[1])
        trainer.push()
        trainer.start_step = step + 1
    return step + 1


def save_part(upd: MeshUpdate, cfg: RunConfig, step: int) -> None:
    """Collective: every rank writes its part of the state after ``step``; returns once all have (rank 0 then
    commits them)."""
    save_rank(cfg.out, step, dist.get_rank(), upd.state_dict())
    dist.barrier()


def follow(upd: MeshUpdate, cfg: RunConfig, first: int, stop: MeshStop) -> int:
    """A rank other than 0: its part of every step from ``first`` and of rank 0's checkpoints (``DistCoTrainer``).
    Returns the last step done."""
    saved, step = None, first - 1
    for step in range(first, cfg.steps):
        follower_step(upd, cfg, step)
        upd.gather_to_root()
        if checkpoint_due(cfg, step):
            save_part(upd, cfg, step)
            saved = step
        if stop.requested:               # as CoTrainer.run and save_after_stop on rank 0
            if step not in (cfg.steps - 1, saved):
                save_part(upd, cfg, step)
            break
    return step


@torch.no_grad()
def load_weights(module: torch.nn.Module, state: dict) -> None:
    params = dict(module.named_parameters())
    if set(state) != set(params):
        raise ValueError("gathered weights and the module differ in names, e.g. "
                         f"{sorted(set(state) ^ set(params))[:3]}")
    for k, v in state.items():
        params[k].copy_(v)


def follower_step(upd: MeshUpdate, cfg: RunConfig, step: int, batch_adv=None):
    """One update on every rank: rank 0 passes (batch, advantages), which the others receive."""
    box = [None]
    if dist.get_rank() == 0:
        batch, adv = batch_adv
        box = [{"ids": batch.input_ids.cpu(), "att": batch.attention_mask.cpu(),
                "mask": batch.loss_mask.cpu(), "old": batch.rollout_logp.cpu(), "adv": adv.cpu()}]
    dist.broadcast_object_list(box, src=0)
    b = box[0]
    return upd.step(b["ids"], b["att"], b["mask"], b["old"], b["adv"],
                    anchor_seed=cfg.rollout_seed * 7919 + step)


def _param_checksum(model: torch.nn.Module, device) -> torch.Tensor:
    return torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1).to(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg, shape, n_mb = build_config(args, world)
    except (ConfigError, ProfileError, FileNotFoundError) as exc:
        print(f"dist_run: error: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels.launch import init_from_env
    from repro.rl.hf_tokenizer import tokenizer_for_run
    from repro.rl.warmstart import make_policy, update_autocast_dtype
    rank, _ = init_from_env("nccl" if cfg.device.startswith("cuda") else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if cfg.device.startswith("cuda") else "cpu"
    trainer = None
    try:
        box = [None]
        if rank == 0:
            tok = tokenizer_for_run(cfg, out=args.out, seed=args.seed, warm_start=args.warm_start)
            trainer = DistCoTrainer(cfg, tok)
            draft_state = ({k: v.cpu() for k, v in trainer.draft.state_dict().items()} if trainer.draft
                           else None)
            box = [{"mask_id": tok.mask_id, "draft": draft_state}]
        dist.broadcast_object_list(box, src=0)
        mesh = Mesh(shape, "cuda" if cfg.device.startswith("cuda") else "cpu")
        policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=torch.float32, device=device,
                             warm_start=cfg.warm_start)
        sums = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
        dist.all_gather(sums, _param_checksum(policy.model, device))
        if len({float(s) for s in sums}) != 1:
            raise RuntimeError("ranks built different initial policies (parameter checksums "
                               f"{[float(s) for s in sums]})")
        amp = update_autocast_dtype(cfg.dtype, device) if args.update_dtype == "auto" else None
        upd = MeshUpdate(cfg, mesh, policy, box[0]["draft"], mask_token_id=box[0]["mask_id"],
                         transport=tap_transport(args.tap_transport, device), device=device,
                         autocast_dtype=amp)
        del policy
        layout = {"pp": shape.pp, "cp": shape.cp, "world": world}
        if rank == 0:
            trainer.attach(upd, layout)
        try:
            first = resume(upd, trainer, args, cfg, layout)
        except ConfigError as exc:
            if rank == 0:
                print(f"dist_run: error: {exc}", file=sys.stderr)
            return 2
        with StopOnSignal(f"dist_run rank {rank}", same_within_s=2.0) as signals:
            stop = MeshStop(signals, device)
            if rank == 0:
                done = lead(trainer, upd, args, cfg, shape, n_mb, amp, first, stop)
            else:
                done = follow(upd, cfg, first, stop)
        upd.close()
        if stop.cut_short(done, cfg.steps):
            if rank == 0:
                say(f"dist_run: stopped after step {done}, every rank's state checkpointed in {args.out}; the same "
                    "command continues from there")
            return stop.exit_code
    finally:
        dist.destroy_process_group()
    return 0


def lead(trainer: DistCoTrainer, upd: MeshUpdate, args: argparse.Namespace, cfg: RunConfig, shape: MeshShape,
         n_mb: int, amp, first: int, stop: MeshStop) -> int:
    """Rank 0: the steps from ``first`` with their metrics logged, then, unless a signal stopped the run before its
    last step (its state checkpointed), the run record. Returns the last step done."""
    if first:
        print(f"[{args.artifact} {args.row}] resuming at step {first}", flush=True)
    world = shape.pp * shape.cp
    print(f"[{args.artifact} {args.row}] dist_run: pp={shape.pp} cp={shape.cp} ({world} ranks, "
          f"{n_mb} microbatches of {cfg.grpo.microbatch}), {cfg.steps} steps -> {args.out}",
          flush=True)
    parallel = {"pp": shape.pp, "cp": shape.cp, "world": world, "microbatches": n_mb,
                "tap_transport": upd.transport, "backend": dist.get_backend(),
                "update_autocast": str(amp).removeprefix("torch.") if amp is not None else "off"}
    # artifact "dist": the run keeps its row label and config (cfg.artifact) but stays out of the
    # single-process artifact's summaries and tables (different microbatching, parallel layout)
    label = DIST_ARTIFACT if args.log_artifact == "dist" else args.artifact
    with MetricsLogger(args.out, artifact=label, profile=cfg.profile, config={**cfg.to_dict(), "parallel": parallel},
                       name=Path(args.out).name, resume_at=first or None,
                       extra_tags=[f"row:{args.row}", f"draft:{cfg.draft.family if cfg.draft else 'none'}",
                                   f"source_artifact:{args.artifact}", f"pp:{shape.pp}", f"cp:{shape.cp}",
                                   "launcher:torchrun"]) as log:
        rows = trainer.run(log, stop=stop)
    done = first - 1 if trainer.last_done is None else trainer.last_done
    if stop.cut_short(done, cfg.steps):
        return done
    write_json_atomic(Path(args.out) / "run.json", {
        "artifact": args.artifact, "row": args.row, "profile": cfg.profile, "steps": cfg.steps,
        "resumed_at": first, "last": rows[-1] if rows else None, "draft_warm_start": trainer.draft_warm,
        "parallel": parallel})
    drop(args.out)
    return done


if __name__ == "__main__":
    sys.exit(main())
