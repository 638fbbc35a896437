"""The joint GRPO + draft update on a PP x CP process mesh (gloo on CPU, NCCL on GPUs).

World rank ``p * cp + c`` runs pipeline stage ``p`` (a slice of the policy's decoder layers) on CP shard ``c`` of
every microbatch: the mesh is a ``DeviceMesh`` of dims ``("pp", "cp")``; ``Schedule1F1B`` runs on its ``pp``
groups, the zigzag ring attention (``repro.rl.cp.CPPolicyStage``) on its ``cp`` groups. The draft lives on the
last stage; each of its CP ranks gets the taps of its own shard from the earlier stages over
``kernels.transport.TapChannel`` (one channel per CP index, outside the schedule) and runs its CP attention in the
last stage's CP group. Block drafts read the last stage's head and an embedding copy that stage 0 sends after
every step, both with the gradient stopped.

A microbatch (``cfg.grpo.microbatch`` sequences) is packed to real tokens and sharded
(``repro.parallel.cp_batch.PackedShard``), every microbatch of a step padded to one length so stage shapes are
static. Loss per microbatch on the last stage: GRPO's clipped loss over its rows (normalised by the batch's token
count) plus ``lambda * (sequences / B) * L_draft``. Each stage is replicated over its CP group by DDP (the CP ranks
hold the same parameters, as Megatron's DP x CP replicas do; the schedule runs all but the last microbatch under
``no_sync``); the policy's gradient norm is reduced across PP stages and clipped as torchtitan does, the draft
clipped on its own, then the same AdamW step as ``JointUpdate`` (tests/rl/test_mesh_update.py checks equality,
PP=2 x CP=2). ``autocast_dtype`` runs the forward passes under ``torch.autocast`` over fp32 weights.

    mesh = Mesh(MeshShape(pp=2, cp=2), "cpu")                # collective, under torch.distributed
    upd = MeshUpdate(cfg, mesh, policy, draft_state, mask_token_id=tok.mask_id)
    stats = upd.step(ids, attention_mask, loss_mask, rollout_logp, advantages, anchor_seed=0)
    weights = upd.gather_to_root()                           # rank 0: (policy, draft) state dicts
    python -m pytest -q tests/rl/test_mesh_update.py
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.nn.parallel import DistributedDataParallel

from kernels.transport import ChannelLayout, TapChannel, sequence_stamp
from repro.core.specs import ConfigError
from repro.parallel.cp_batch import PackedShard, grpo_targets, padded_length
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.parallel.harness import LastStage
from repro.parallel.model import split_layers, stage_of_tap
from repro.parallel.taps import TapRouter
from repro.rl.config import RunConfig
from repro.rl.cp import CPPolicyStage
from repro.rl.dist_parts import (
    clip_across,
    grpo_rows_loss,
    read_remote_taps,
    release_after_backward,
    replicate_over,
    stage_to_hf,
    tap_sources,
)
from repro.rl.drafts import StopGradParts, build_draft, trainable_parameters
from repro.rl.joint import UpdateStats, draft_loss_mask, joint_optimizer, set_draft_lr
from repro.rl.warmstart import autocast_or_off, check_autocast_dtype


@dataclass(frozen=True)
class MeshShape:
    pp: int
    cp: int

    def rank_of(self, p: int, c: int) -> int:
        return p * self.cp + c

    def coords(self, rank: int) -> tuple[int, int]:
        return rank // self.cp, rank % self.cp

    def check(self, world: int, cfg: RunConfig, num_layers: int) -> int:
        """Validate the mesh against the world and the run; returns the microbatch count. Raises
        ConfigError naming the bad value before any group or model is built."""
        for k, v in (("pp", self.pp), ("cp", self.cp)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"config {k}={v!r} is invalid: expected a positive integer")
        if self.pp * self.cp != world:
            raise ConfigError(f"config pp*cp={self.pp}*{self.cp}={self.pp * self.cp} is invalid: expected "
                              f"the world size {world} (one rank per (stage, CP shard))")
        if self.pp > num_layers:
            raise ConfigError(f"config pp={self.pp} is invalid: the policy has {num_layers} decoder layers, "
                              "expected at most one stage per layer")
        if cfg.grpo.kl_coef:
            raise ConfigError(f"config grpo.kl_coef={cfg.grpo.kl_coef} is invalid under the PP x CP update: "
                              "expected 0 (the frozen reference policy is not sharded yet)")
        if cfg.grpo.compile_layers:
            raise ConfigError("config grpo.compile_layers=True is invalid under the PP x CP update: expected false "
                              "(the compiled update forward is the single-process update's, repro.rl.joint)")
        if cfg.draft is not None and cfg.draft.microbatch:
            raise ConfigError(f"config draft.microbatch={cfg.draft.microbatch} is invalid under the PP x CP "
                              "update: expected 0 (the draft runs in the last stage's microbatches; the "
                              "deferred draft pass is the single-process update's, repro.rl.joint)")
        B = cfg.grpo.rows_per_step
        n_mb = -(-B // cfg.grpo.microbatch)
        if self.pp > 1 and n_mb < self.pp:
            raise ConfigError(f"config grpo.microbatch={cfg.grpo.microbatch} is invalid with pp={self.pp}: "
                              f"a batch of {B} sequences makes {n_mb} microbatch(es), 1F1B needs at least "
                              f"{self.pp}; expected microbatch <= {B // self.pp}")
        return n_mb


class Mesh:
    """A PP x CP ``DeviceMesh`` (dims ``"pp"``, ``"cp"``) and this rank's place in it; building it is
    collective over the world. ``pp_group`` / ``cp_group`` are None where that dim has one rank."""

    def __init__(self, shape: MeshShape, device_type: str = "cpu"):
        world = dist.get_world_size()
        if shape.pp * shape.cp != world:
            raise ValueError(f"mesh {shape.pp}x{shape.cp} does not cover the world of {world} ranks")
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"mesh device_type={device_type!r}: expected 'cpu' (gloo) or 'cuda' (NCCL)")
        self.shape, self.rank = shape, dist.get_rank()
        self.device_mesh = init_device_mesh(device_type, (shape.pp, shape.cp), mesh_dim_names=("pp", "cp"))
        self.p, self.c = self.device_mesh.get_coordinate()
        if (self.p, self.c) != shape.coords(self.rank):    # the layout every other piece derives on its own
            raise RuntimeError(f"rank {self.rank}: DeviceMesh placed it at (pp, cp) = {(self.p, self.c)}, "
                               f"expected {shape.coords(self.rank)}")
        self.pp_group = self.device_mesh.get_group("pp") if shape.pp > 1 else None
        self.cp_group = self.device_mesh.get_group("cp") if shape.cp > 1 else None

    @property
    def is_first(self) -> bool:
        return self.p == 0

    @property
    def is_last(self) -> bool:
        return self.p == self.shape.pp - 1


@dataclass
class MeshStats(UpdateStats):
    tap_wait_s: float = 0.0        # the draft stage's wait for remote taps (max over its CP ranks)
    update_cpu_s: float = 0.0      # process CPU seconds of the update (max over ranks)
    local_rows: int = 0            # rows of this rank's shard per microbatch (padded)
    microbatches: int = 0


class MeshUpdate:
    """One rank's part of the joint update on a ``Mesh``; keeps its stage, draft and optimizer state."""

    def __init__(self, cfg: RunConfig, mesh: Mesh, policy, draft_state: dict | None, *, mask_token_id: int,
                 transport: str = "shm", device: str | torch.device = "cpu", tap_timeout_s: float = 300.0,
                 autocast_dtype: torch.dtype | None = None):
        check_autocast_dtype(autocast_dtype)
        self.cfg, self.mesh = cfg.validate(), mesh
        self.autocast_dtype = autocast_dtype
        P, C = mesh.shape.pp, mesh.shape.cp
        self.n_mb = mesh.shape.check(P * C, cfg, policy.num_layers)
        self.device = torch.device(device)
        self.transport, self.tap_timeout_s = transport, tap_timeout_s
        self.H, self.V = policy.hidden_size, policy.vocab_size
        self.ranges = split_layers(policy.num_layers, P)
        self.stage = CPPolicyStage(policy.model, mesh.p, self.ranges[mesh.p], P).to(self.device)
        self.stage.autocast_dtype = autocast_dtype
        self.draft = None
        self.taps: dict[int, int] = {}
        self.embed_copy = None
        if cfg.draft is not None:
            draft = build_draft(cfg.draft, policy, mask_token_id=mask_token_id, train=True)
            if draft_state is not None:
                draft.load_state_dict(draft_state)
            self.taps = {t: stage_of_tap(t, self.ranges) for t in draft.tap_layers}
            self.block = hasattr(draft, "backbone")
            if mesh.is_last:
                self.draft = draft.to(self.device)
                if self.block:       # the head is the last stage's own; the embedding a synced copy
                    emb = self.stage.embed_tokens
                    if emb is None:
                        emb = copy.deepcopy(policy.embed_tokens).to(self.device).requires_grad_(False)
                        self.embed_copy = emb
                    parts = SimpleNamespace(embed_tokens=emb, lm_head=self.stage.lm_head)
                    self.draft.attach(StopGradParts(parts))
        self.sources = tap_sources(self.taps, P - 1, 1, self.H)   # rows are set when the channel opens
        self.channels: list[TapChannel] = []
        self.capacity = 0
        self.router = TapRouter(None, self.n_mb, draft_stage=P - 1)
        for t, s in self.taps.items():
            if s == mesh.p:
                self.router.hook(s, self.stage.embed_tokens if t == -1 else self.stage.layers[str(t)], t)
        # the last stage carries the draft as a sub-module (every schedule's backward reaches its parameters)
        module = LastStage(self.stage, self.draft) if mesh.is_last and self.draft is not None else self.stage
        self.module = replicate_over(module, mesh.cp_group, self.device)
        self.params = [p for p in self.stage.parameters() if p.requires_grad]
        self.dparams = trainable_parameters(self.draft) if self.draft is not None else []
        self.optimizer = joint_optimizer(self.params, self.dparams, cfg.grpo, cfg.draft)
        self.steps_done = 0
        self.last_grads: dict | None = None
        info = None
        if mesh.c == 0:
            draft_params = self.draft.named_parameters() if self.draft is not None else []
            info = (mesh.p, [(stage_to_hf(n), tuple(p.shape)) for n, p in self.stage.named_parameters()],
                    [(n, tuple(p.shape)) for n, p in draft_params])
        box = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(info, box, dst=0)
        self._layout = {i[0]: i[1:] for i in box if i is not None} if box is not None else None

    # -- tap channels ---------------------------------------------------------------------------------
    def _ensure_channels(self, rows: int) -> None:
        """One TapChannel per CP index, slots of >= ``rows`` rows; (re)opened collectively when too small."""
        if not self.sources or rows <= self.capacity:
            return
        self._close_channels()
        cap = rows if self.capacity == 0 else max(rows, self.capacity * 5 // 4)
        shape, P = self.mesh.shape, self.mesh.shape.pp
        specs = tap_sources(self.taps, P - 1, cap, self.H)
        backend = "nccl" if self.transport == "p2p" and self.device.type == "cuda" else "gloo"
        for c in range(shape.cp):
            lay = ChannelLayout(sources=specs, stage_to_rank={s: shape.rank_of(s, c) for s in range(P)},
                                consumer_rank=shape.rank_of(P - 1, c), ring_depth=self.n_mb)
            self.channels.append(TapChannel.setup(lay, self._new_transport(), backend=backend,
                                                  device=self.device, get_timeout_s=self.tap_timeout_s,
                                                  put_timeout_s=self.tap_timeout_s))
        self.capacity = cap
        self.router.channel = self.channels[self.mesh.c]

    def _new_transport(self):
        """The channel's transport: p2p carries every stamp in order from the first one the channel will see
        (a channel reopened with larger slots starts at this step's first microbatch)."""
        if self.transport != "p2p":
            return self.transport
        from kernels.transport.transports.p2p import P2PTransport
        return P2PTransport(first_seq=sequence_stamp(self.steps_done, 0, self.n_mb))

    def _close_channels(self) -> None:
        for ch in self.channels:
            ch.close()
        self.channels = []
        self.router.channel = None

    # -- one update -----------------------------------------------------------------------------------
    def step(self, ids, attention_mask, loss_mask, rollout_logp, advantages, *, anchor_seed: int = 0,
             keep_grads: bool = False) -> MeshStats:
        cfg, mesh, dev = self.cfg, self.mesh, self.device
        P, C = mesh.shape.pp, mesh.shape.cp
        t0, c0 = time.perf_counter(), time.process_time()
        ids, att, mask = ids.to(dev), attention_mask.to(dev), loss_mask.to(dev)
        old, adv = rollout_logp.to(dev), advantages.to(dev)
        B, S = ids.shape
        n_tok = float(mask.sum())
        if n_tok == 0:
            raise ValueError("rollout batch has no policy-written tokens to train on")
        mb = cfg.grpo.microbatch
        slices = [slice(s, min(B, s + mb)) for s in range(0, B, mb)]
        if len(slices) != self.n_mb:
            raise ValueError(f"a batch of {B} sequences makes {len(slices)} microbatches of {mb}; this "
                             f"update was built for {self.n_mb} (prompts_per_step x "
                             "generations_per_prompt changed?)")
        lengths = att.long().sum(1).cpu()
        pad = max(padded_length(lengths[sl], C) for sl in slices)
        shards = [PackedShard.build(lengths[sl], S, mesh.cp_group, padded_total=pad) for sl in slices]
        T = shards[0].num_local
        x = torch.stack([sh.local(ids[sl]) for sh, sl in zip(shards, slices)])                # [n_mb, T]
        target = torch.stack([grpo_targets(sh, ids[sl].cpu(), mask[sl].cpu(), old[sl].cpu(), adv[sl].cpu())
                              for sh, sl in zip(shards, slices)]).to(dev)                       # [n_mb, T, 4]
        if cfg.draft is not None:
            self._ensure_channels(T)
        channel = self.router.channel
        self.router.step = self.steps_done
        self.optimizer.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(anchor_seed)
        lam = cfg.draft.loss_weight if cfg.draft is not None else 0.0
        acc = dict.fromkeys(("policy_loss", "draft_loss", "clip", "kl", "tap_wait", "draft_time"), 0.0)
        stage = self.stage

        def loss_fn(logits, tgt):
            i = stage.mb
            loss, st = grpo_rows_loss(logits[0], tgt[0], n_tok, cfg.grpo)
            acc["policy_loss"] += float(loss.detach())
            acc["clip"] += st["clip"]
            acc["kl"] += st["kl"]
            if self.draft is None:
                return loss
            seq = sequence_stamp(self.steps_done, i, self.n_mb)
            feats = dict(self.router.local.pop(seq, {}))
            if channel is not None:
                remote, waited = read_remote_taps(channel, self.sources, seq, (1, T))
                feats.update(remote)
                acc["tap_wait"] += waited
            td = time.perf_counter()
            sl = slices[i]
            dbatch = DraftBatch(input_ids=ids[sl], loss_mask=draft_loss_mask(mask[sl]),
                                policy_logits=logits.detach(),
                                extras={"anchor_generator": gen, "cp": shards[i]})
            with autocast_or_off(dev.type, self.autocast_dtype):
                dl = self.draft.draft_loss(TargetFeatures(feats), dbatch)
            acc["draft_time"] += time.perf_counter() - td
            frac = (sl.stop - sl.start) / B
            acc["draft_loss"] += float(dl.detach()) * frac
            return loss + lam * frac * dl

        if P == 1:
            for i in range(self.n_mb):
                stage.mb, stage.shard = i, shards[i]
                self.router.current[0] = i
                with self._no_sync(last=i == self.n_mb - 1):
                    loss_fn(self.module(x[i:i + 1]), target[i:i + 1]).backward()
        else:
            self._run_schedule(x, target, shards, loss_fn, T)
        if channel is not None:
            channel.flush()
        stage.shard = None
        # gradients are summed over the CP group (DDP, during the last backward); the policy's norm spans the
        # stages
        p_norm = clip_across(self.params, cfg.grpo.max_grad_norm, mesh.pp_group)
        d_norm = (float(torch.nn.utils.clip_grad_norm_(self.dparams, cfg.draft.max_grad_norm)) if self.dparams
                  else 0.0)
        if keep_grads:
            def grads_of(module):
                return {n: p.grad.detach().clone() for n, p in module.named_parameters()
                        if p.grad is not None}
            self.last_grads = {"policy": {stage_to_hf(n): g for n, g in grads_of(stage).items()},
                               "draft": grads_of(self.draft) if self.dparams else {}}
        set_draft_lr(self.optimizer, cfg.draft)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync_embedding()
        self.steps_done += 1
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        sums = torch.tensor([acc["policy_loss"], acc["draft_loss"], acc["clip"], acc["kl"]],
                            dtype=torch.float64, device=dev)
        maxes = torch.tensor([wall, acc["draft_time"], acc["tap_wait"], d_norm, cpu], dtype=torch.float64,
                             device=dev)
        dist.all_reduce(sums)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        s, m = sums.tolist(), maxes.tolist()
        return MeshStats(policy_loss=s[0], draft_loss=s[1], policy_grad_norm=p_norm, draft_grad_norm=m[3],
                         train_inference_kl=s[3] / n_tok, clip_frac=s[2] / n_tok, update_time_s=m[0],
                         draft_time_s=m[1], tap_wait_s=m[2], update_cpu_s=m[4], local_rows=T,
                         microbatches=self.n_mb)

    def _no_sync(self, last: bool):
        """DDP's gradient accumulation without communication, for every microbatch but the step's last."""
        if last or not isinstance(self.module, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.module.no_sync()

    def _run_schedule(self, x, target, shards, loss_fn, T: int) -> None:
        """One 1F1B pass over the microbatches on this rank's pipeline (static shapes of this step)."""
        mesh, P, dev = self.mesh, self.mesh.shape.pp, self.device
        stage = self.stage
        inp = torch.zeros(1, T, dtype=torch.long, device=dev) if mesh.is_first else \
            torch.zeros(1, T, self.H, device=dev, requires_grad=True)
        out = torch.zeros(1, T, self.V if mesh.is_last else self.H, device=dev, requires_grad=True)
        pipe = PipelineStage(self.module, mesh.p, P, dev, input_args=(inp,), output_args=(out,),
                             group=mesh.pp_group)
        self.router.track(mesh.p, pipe)
        tracked = pipe.forward_one_chunk

        def forward_one_chunk(fwd_chunk_id, *args, **kwargs):   # the stage runs on this microbatch's shard
            stage.mb, stage.shard = fwd_chunk_id, shards[fwd_chunk_id]
            return tracked(fwd_chunk_id, *args, **kwargs)
        pipe.forward_one_chunk = forward_one_chunk
        if mesh.is_last and self.router.channel is not None:
            release_after_backward(pipe, self.router.channel, self.sources, lambda: self.steps_done,
                                   self.n_mb)
        schedule = Schedule1F1B(pipe, self.n_mb, loss_fn=loss_fn, scale_grads=False)
        if mesh.is_last:
            schedule.step(*((x,) if mesh.is_first else ()), target=target, losses=[])
        else:
            schedule.step(*((x,) if mesh.is_first else ()))

    def _sync_embedding(self) -> None:
        """Block drafts on the last stage read the embedding through a copy: stage 0 sends it the updated
        weights over the pipeline's group (the schedule's traffic of the step is done by then)."""
        mesh = self.mesh
        if mesh.pp_group is None or self.cfg.draft is None or not self.block:
            return
        if not (mesh.is_first or mesh.is_last):
            return
        first, last = mesh.shape.rank_of(0, mesh.c), mesh.shape.rank_of(mesh.shape.pp - 1, mesh.c)
        with torch.no_grad():
            if mesh.is_first:
                dist.send(self.stage.embed_tokens.weight.data, dst=last, group=mesh.pp_group)
            else:
                dist.recv(self.embed_copy.weight.data, src=first, group=mesh.pp_group)

    # -- checkpoints (repro.rl.dist_checkpoint) ----------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's part of the run: its stage's parameters, the draft (last stage) and the embedding copy a
        block draft reads, the optimizer's moments and the number of updates made."""
        return {"stage": self.stage.state_dict(),
                "draft": self.draft.state_dict() if self.draft is not None else None,
                "embed_copy": self.embed_copy.state_dict() if self.embed_copy is not None else None,
                "optimizer": self.optimizer.state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()`` of the same rank of the same layout."""
        self.stage.load_state_dict(state["stage"])
        for name, module in (("draft", self.draft), ("embed_copy", self.embed_copy)):
            if (module is None) != (state[name] is None):
                raise ValueError(f"the checkpoint {'holds' if module is None else 'lacks'} a {name} and this rank "
                                 f"{'does not' if module is None else 'does'}: written by another layout or draft")
            if module is not None:
                module.load_state_dict(state[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state["steps_done"])

    # -- weights back to rank 0 -------------------------------------------------------------------------
    def gather_to_root(self) -> tuple[dict, dict] | None:
        """Rank 0 receives every stage's parameters (HF names) and the draft's from CP index 0 of each
        stage; returns ``(policy, draft)`` state dicts there (the draft's {} without one), None elsewhere."""
        shape, me = self.mesh.shape, dist.get_rank()
        mine = None
        if self.mesh.c == 0:
            tensors = [p.detach() for p in self.stage.parameters()]
            if self.draft is not None:
                tensors += [p.detach() for p in self.draft.parameters()]
            mine = torch.cat([t.float().reshape(-1) for t in tensors])
        policy, draft = {}, {}
        for p in range(shape.pp):
            src = shape.rank_of(p, 0)
            if me == src and me != 0:
                dist.send(mine, dst=0)
            elif me == 0:
                names, dnames = self._layout[p]
                n = sum(int(torch.Size(s).numel()) for _, s in names + dnames)
                flat = mine if src == 0 else torch.empty(n, dtype=torch.float32, device=self.device)
                if src != 0:
                    dist.recv(flat, src=src)
                off = 0
                for table, entries in ((policy, names), (draft, dnames)):
                    for name, s in entries:
                        k = int(torch.Size(s).numel())
                        table[name] = flat[off:off + k].view(s).clone()
                        off += k
        return (policy, draft) if me == 0 else None

    def close(self) -> None:
        """Collective: closes the tap channels (before the process groups go)."""
        self._close_channels()
        self.router.remove()


def mesh_update_worker(rank: int, world: int, payloads: list[dict], pp: int, cp: int) -> list[dict]:
    """Joint updates on a pp x cp mesh from ``repro.rl.pp.make_payload`` payloads (one mesh; per payload a
    fresh update of one step, or more with ``payload["more"]``); per payload this rank's parameters, the
    last step's clipped gradients and stats, and on rank 0 the gathered state."""
    from repro.rl.warmstart import make_policy
    mesh = Mesh(MeshShape(pp, cp), "cpu")
    outs = []
    for payload in payloads:
        cfg = RunConfig.from_dict(payload["cfg"]).validate()
        policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=torch.float32, device="cpu")
        policy.model.load_state_dict(payload["policy"])
        upd = MeshUpdate(cfg, mesh, policy, payload["draft"], mask_token_id=payload["mask_token_id"],
                         transport=payload.get("transport", "shm"),
                         autocast_dtype=getattr(torch, payload["autocast"]) if payload.get("autocast")
                         else None)
        for st in [payload, *payload.get("more", [])]:        # "more": later steps' batches, same keys
            stats = upd.step(st["ids"], st["att"], st["mask"], st["old"], st["adv"],
                             anchor_seed=st.get("anchor_seed", 0), keep_grads=True)
        gathered = upd.gather_to_root()
        outs.append({"rank": rank, "coords": (mesh.p, mesh.c), "stats": asdict(stats),
                     "policy": {stage_to_hf(n): p.detach().clone() for n, p in upd.stage.named_parameters()},
                     "grads": upd.last_grads["policy"], "draft_grads": upd.last_grads["draft"],
                     "draft": ({k: v.clone() for k, v in upd.draft.state_dict().items()}
                               if upd.draft is not None else None), "gathered": gathered})
        upd.close()
    return outs


def cp_update_worker(rank: int, world: int, payload: dict) -> dict:
    """One rank of a CP=world joint update (PP=1, with or without a draft); returns its updated
    parameters (HF names), clipped gradients, the total policy loss and its local row count."""
    out = mesh_update_worker(rank, world, [payload], 1, world)[0]
    return {"rank": rank, "policy": out["policy"], "grads": out["grads"],
            "policy_loss": out["stats"]["policy_loss"], "draft_loss": out["stats"]["draft_loss"],
            "draft_grads": out["draft_grads"],
            "local_rows": out["stats"]["local_rows"]}
