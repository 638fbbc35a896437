"""The co-training loop: rollout (speculative when a draft is present), reward, GRPO + draft update, weight push.

``CoTrainer(cfg, tok)`` holds two copies of every model, as an RL system does: the trainer's fp32
policy and draft (updated by ``JointUpdate``) and the rollout engine's copies in the profile's dtype,
refreshed by ``push_weights`` after every update (NeMo-RL's refit; the draft's weights travel with the
policy's). One step:

    rollout(step)  -> RolloutBatch (tokens, engine log-probs, rewards, acceptance counters, times)
    advantages     -> group-relative
    update         -> L_RL + lambda * L_draft(sg(taps)) in one backward, per-group clipping
    push_weights   -> the engine decodes the next step with the new policy and draft

``run(logger)`` repeats it for ``cfg.steps`` steps, logs one metrics row per step (row = the run's
table/figure row label, step = the training step; names in ``STEP_METRICS``), validates on the
held-out split every ``val_every`` steps, checkpoints every ``ckpt_every`` steps (written in the
background, never beside a timed step: each step first waits for the process's writes in flight) and resumes from
the last checkpoint of its run folder.

    python -m repro.rl.run --artifact table1 --row "Qwen3-8B/DFlash" --profile cpu-tiny --out /tmp/r
"""
from __future__ import annotations

import copy
import functools
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.profiler import record_function as phase  # named ranges for torch.profiler (studies/rl_profile)

from repro.core.gc_time import collector_seconds, freeze_survivors
from repro.core.handoffs import rollout_engine
from repro.core.progress import Progress
from repro.decoding.cuda_graph import GraphedCallable, active_graph_pools, graph_pool_bytes
from repro.decoding.policy_cache import SharedKVStorage
from repro.rl.checkpoint import CheckpointWriter, load_checkpoint, wait_for_writes, warm_start_digest
from repro.rl.config import RunConfig
from repro.rl.drafts import build_draft, make_proposer
from repro.rl.episodes import RolloutBatch, chat_prompt, math_rollout, workplace_rollout
from repro.rl.grpo import group_advantages
from repro.rl.joint import JointUpdate, UpdateStats
from repro.rl.sft import draft_token_counts
from repro.rl.stop import StopOnSignal
from repro.rl.tasks.math import math_tasks
from repro.rl.tasks.workplace import WorkplaceTaskSet
from repro.rl.tokenizer import WorkloadTokenizer
from repro.rl.warmstart import DTYPES, draft_file, load_draft_weights, make_policy, update_autocast_dtype
from repro.rollout.engine import RolloutEngine

OBSERVATION_TOKENS = 24     # what a tool's observation is taken to add to a multi-turn episode's prompt, at most

# metric names of the per-step rows (prefix "train/" or "val/": the tables' summary names stay free);
# *_cpu_s are process CPU seconds (+ tool latency), the basis of speedups on shared CPU machines
STEP_METRICS = ("train/reward", "train/response_len", "train/train_inference_kl", "train/acceptance_length",
                "train/rollout_time_s", "train/update_time_s", "train/step_time_s", "train/throughput_tok_s",
                "train/rollout_cpu_s", "train/update_cpu_s", "train/step_cpu_s",
                "train/rollout_tok_s", "train/draft_loss", "train/policy_loss", "train/weight_push_s",
                "train/tool_time_s", "train/draft_time_s", "train/gen_tokens", "train/rollout_forwards",
                "val/accuracy")
log = logging.getLogger(__name__)


@torch.no_grad()
def push_weights(src: torch.nn.Module, dst: torch.nn.Module) -> int:
    """Copy every parameter and buffer of ``src`` into ``dst`` (casting to its dtype); returns bytes moved."""
    s, d = src.state_dict(), dst.state_dict()
    if s.keys() != d.keys():
        missing = sorted(set(s) ^ set(d))
        raise ValueError(f"weight push: trainer and rollout modules differ in keys, e.g. {missing[:3]}")
    moved = 0
    for k, v in s.items():
        d[k].copy_(v)
        moved += d[k].numel() * d[k].element_size()
    return moved


def step_metrics(cfg: RunConfig, batch: RolloutBatch, stats: UpdateStats, *, push_s: float, step_time: float,
                 rollout_cpu: float, update_cpu: float, step_cpu: float) -> dict[str, float]:
    """The metrics row of one training step (names in ``STEP_METRICS`` plus grad norms, clip fraction,
    per-position acceptance), shared by ``CoTrainer`` and the distributed loop (``repro.rl.dist_run``)."""
    m = {"train/reward": float(batch.rewards.mean()),
         "train/response_len": batch.gen_tokens / batch.size,
         "train/gen_tokens": batch.gen_tokens,
         # policy forwards of the rollout (verify steps, summed over turns): rollout time / forwards is the
         # cost of one decoding step, which separates per-step overhead from the batch's longest row
         "train/rollout_forwards": batch.policy_forwards,
         "train/train_inference_kl": stats.train_inference_kl,
         "train/rollout_time_s": batch.rollout_time_s,
         "train/tool_time_s": batch.tool_time_s,
         "train/update_time_s": stats.update_time_s,
         "train/weight_push_s": push_s,
         "train/step_time_s": step_time,
         "train/throughput_tok_s": batch.gen_tokens / step_time,
         "train/rollout_tok_s": batch.gen_tokens / batch.rollout_time_s,
         "train/rollout_cpu_s": rollout_cpu,
         "train/update_cpu_s": update_cpu,
         "train/step_cpu_s": step_cpu,
         "train/policy_loss": stats.policy_loss,
         "train/policy_grad_norm": stats.policy_grad_norm,
         "train/clip_frac": stats.clip_frac}
    if cfg.grpo.kl_coef:
        m["train/kl_ref"] = stats.kl_ref
    if cfg.draft is not None:
        m.update({"train/acceptance_length": batch.counters.acceptance_length,
                  "train/draft_loss": stats.draft_loss, "train/draft_grad_norm": stats.draft_grad_norm,
                  "train/draft_time_s": stats.draft_time_s})
        for i, a in enumerate(batch.counters.accepted_per_pos):
            m[f"train/acceptance_rate_pos{i}"] = a / max(1, batch.counters.verify_steps)
    return m


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a compilation inside a timed step shows in its times)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def compiled_frames_since(start_us: int) -> list[str]:
    """The frames dynamo compiled since ``start_us`` (``time.time_ns() // 1000``), each as ``compile id, function
    (file:line)`` and, for a recompilation, the failed guard dynamo records (that of the first compiled entry it
    tried; ``torch._logging``'s recompiles log, which ``repro.rl.run`` turns on, lists every entry's): what a step's
    ``train/compiled_graphs`` counts."""
    found = []
    for m in torch._dynamo.utils.get_compilation_metrics():
        if (m.start_time_us or 0) >= start_us:
            why = f": {m.recompile_reason}" if m.recompile_reason else ""
            found.append(f"{m.compile_id} {m.co_name} ({Path(m.co_filename or '?').name}:{m.co_firstlineno}){why}")
    return found


def _device_alloc_calls() -> int | None:
    """Memory allocations the CUDA caching allocator has requested from the driver so far (None off CUDA)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def device_memory_metrics() -> dict[str, float]:
    """The process's CUDA memory after a step, in GB (empty off CUDA): allocated now, the most allocated since the
    process started, and what the caching allocator holds in CUDA graph pools (in a lockstep, also each shared
    pool's: ``train/graph_pool_memory_gb/<call>``). In a lockstep process every row's trainer counts, so these say
    how far the process is from the card's limit."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    segments = torch.cuda.memory_snapshot()
    out = {"train/device_memory_gb": torch.cuda.memory_allocated() / 1e9,
           "train/device_peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9,
           "train/graph_pool_memory_gb": graph_pool_bytes(segments) / 1e9}
    shared = active_graph_pools()        # a lockstep's pools shared by call: what each call's pool holds
    if shared is not None:
        out.update({f"train/graph_pool_memory_gb/{key}": n / 1e9 for key, n in shared.segment_bytes(segments).items()})
    return out


def checkpoint_due(cfg: RunConfig, step: int) -> bool:
    """Whether a run checkpoints after step ``step``: every ``ckpt_every`` steps, never after its last (a finished
    run keeps no checkpoint)."""
    return bool(cfg.ckpt_every) and (step + 1) % cfg.ckpt_every == 0 and step != cfg.steps - 1


class CoTrainer:
    def __init__(self, cfg: RunConfig, tok: WorkloadTokenizer, *, kv_storage: SharedKVStorage | None = None):
        """``kv_storage``: the rollout engine's static policy caches take their buffers from it, shared with the
        other trainers given the same one (repro.rl.lockstep: rows whose rollouts never overlap)."""
        cfg.validate()
        if tok.vocab_size != cfg.vocab_size:
            raise ValueError(f"tokenizer has {tok.vocab_size} tokens, config vocab_size={cfg.vocab_size}")
        self.cfg, self.tok = cfg, tok
        torch.manual_seed(cfg.seed)
        dev = cfg.device
        self.policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=torch.float32, device=dev,
                                  warm_start=cfg.warm_start)
        self.rollout_policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=DTYPES[cfg.dtype],
                                          device=dev)
        self.reference = None
        if cfg.grpo.kl_coef:
            self.reference = copy.deepcopy(self.policy).requires_grad_(False)
        self.draft = self.rollout_draft = None
        proposer = None
        self.draft_warm = False
        if cfg.draft is not None:
            # a warm-started draft brings its vocabulary maps; a cold one draws them from the demonstrations
            warm = cfg.warm_start and draft_file(cfg.warm_start, cfg.draft.family).is_file()
            counts = None if warm else draft_token_counts(cfg.draft, tok, cfg.workload.name, cfg.seed,
                                                          self.policy.vocab_size, cfg.workload.math_ops)
            self.draft = build_draft(cfg.draft, self.policy, mask_token_id=tok.mask_id, train=True, token_counts=counts)
            self.draft_warm = load_draft_weights(self.draft, cfg.draft, cfg.warm_start)
            self.rollout_draft = build_draft(cfg.draft, self.rollout_policy, mask_token_id=tok.mask_id)
            self.rollout_draft.to(dtype=DTYPES[cfg.dtype])
            push_weights(self.draft, self.rollout_draft)     # the proposer reads the draft's vocabulary maps
            proposer = make_proposer(self.rollout_draft, cfg.draft.num_proposals)
        # on a GPU the profile's dtype is also the update's compute dtype (autocast over fp32 master weights)
        amp = update_autocast_dtype(cfg.dtype, dev)
        self.update = JointUpdate(self.policy, self.draft, cfg.grpo, cfg.draft, self.reference, autocast_dtype=amp)
        max_prompt = 256
        max_len = (max_prompt + cfg.grpo.max_new_tokens + 64
                   + (cfg.workload.max_tool_calls * OBSERVATION_TOKENS if cfg.workload.name == "workplace" else 0))
        if cfg.rollout_backend != "suite":      # vLLM (integrations/) decodes exported copies; push() reloads them
            self.engine = rollout_engine(cfg.rollout_backend).from_models(
                self.rollout_policy, self.rollout_draft, workdir=Path(cfg.out) / cfg.rollout_backend,
                max_model_len=max_len, num_speculative_tokens=cfg.draft.num_proposals if cfg.draft is not None else 3,
                seed=cfg.rollout_seed)
        else:
            # on a GPU the held-out rollouts (val_size rows) run on the training batch's static state: one policy
            # cache per run, not two (at 144 new tokens a block draft's cache at 64 rows is 9.4 GB; a lockstep of
            # four rows on an 80 GB card ran out of memory holding both). On a CPU fewer rows cost less
            static = cfg.cuda_graphs != "off" and cfg.device.startswith("cuda")
            self.engine = RolloutEngine(self.rollout_policy, proposer, max_model_len=max_len,
                                        cuda_graphs=cfg.cuda_graphs, bucket_batch=cfg.bucket_batch,
                                        min_static_rows=cfg.grpo.rows_per_step if static else None,
                                        kv_storage=kv_storage)
        self.math = math_tasks(cfg.seed, cfg.workload.math_ops) if cfg.workload.name == "math" else None
        self.workplace = WorkplaceTaskSet(cfg.seed) if cfg.workload.name == "workplace" else None
        self._pool: ThreadPoolExecutor | None = None      # the workplace tools' thread pool, made on first use
        self.start_step = 0
        self.progress: Progress | None = None        # steps of this run, shown as they finish
        self.checkpoints = CheckpointWriter(cfg.out)      # written in the background; close() waits for the last
        self.last_done: int | None = None            # the last step this process finished, and the last saved
        self.saved_step: int | None = None
        self.push()

    # -- pieces of a step --------------------------------------------------------------------------------
    def push(self) -> tuple[float, int]:
        t0 = time.perf_counter()
        moved = push_weights(self.policy.model, self.rollout_policy.model)
        if self.draft is not None:
            moved += push_weights(self.draft, self.rollout_draft)
        if self.cfg.rollout_backend != "suite":
            self.engine.reload_policy(self.rollout_policy)
            if self.rollout_draft is not None:
                self.engine.reload_draft(self.rollout_draft)
        if self.cfg.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, moved

    def rollout(self, step: int, *, split: str = "train", greedy: bool = False,
                every_step: bool = False) -> RolloutBatch:
        """The rollouts of step ``step`` (``every_step``: warm_up's, math workload only)."""
        g, c = self.cfg.grpo, self.cfg
        seed = c.rollout_seed * 100003 + step * 7 + (1 if split != "train" else 0)
        if self.math is not None:
            if split == "train":
                items, group = self.train_problems(step), g.generations_per_prompt
            else:
                items, group = self.math.problems("heldout", c.workload.val_size), 1
            return math_rollout(self.engine, self.tok, items, group_size=group, max_new_tokens=g.max_new_tokens,
                                temperature=g.temperature, seed=seed, greedy=greedy, every_step=every_step)
        if every_step:
            raise ValueError("every_step=True is for the math workload's warm-up (multi-turn episodes warm up through "
                             "RolloutEngine.warm_up)")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=32)
        if split == "train":
            items, group = self.workplace.tasks("train", g.prompts_per_step, draw=step), g.generations_per_prompt
        else:
            items, group = self.workplace.tasks("heldout", c.workload.val_size), 1
        return workplace_rollout(self.engine, self.tok, items, group_size=group, max_new_tokens=g.max_new_tokens,
                                 temperature=g.temperature, seed=seed, tool_latency_s=c.workload.tool_latency_s,
                                 max_tool_calls=c.workload.max_tool_calls, greedy=greedy, pool=self._pool)

    def train_problems(self, step: int) -> list:
        """The math problems of training step ``step`` (the rollout's and the warm-up's: one definition)."""
        return self.math.problems("train", self.cfg.grpo.prompts_per_step, draw=step)

    def validate(self, step: int) -> float:
        """Greedy accuracy on the held-out split (AIME 2024's role)."""
        return float(self.rollout(step, split="heldout", greedy=True).rewards.mean())

    def warm_up(self) -> int:
        """Before the first step this process runs: compile the update's graph (``JointUpdate.prepare``, at the shape
        of the run's microbatches: ``grpo.microbatch`` rows of the longest prompt plus ``max_new_tokens``; a graphed
        draft step captures its longest sequence buckets there too) and, on an engine with static caches (graphed on
        a GPU), run one rollout (discarded) for each request shape that the training steps still to run will meet
        (``RolloutEngine.request_shape``: the prompts' bucket and the caches' sizes follow the step's longest
        prompt), each for every step a request can take (``every_step``: the attention views grow with the steps,
        so a later step whose rows run longer would otherwise meet new ones), so that graph captures and
        compilations land here and not inside a step the tables average, a resumed run's first step included; then
        the validation's greedy request the same way, whose compilations (the drafts' greedy proposals) would
        otherwise come after the freeze below, leaving their objects to the collector's later walks. Multi-turn
        episodes instead warm every request their turns can make up to a bound (``_warm_up_turns``). Returns the
        training request shapes warmed (multi-turn: the requests run). Training is unchanged: each rollout is
        seeded by its step and nothing of it is kept. Last, every object then alive is frozen out of the garbage
        collector's walks (``repro.core.gc_time``; ``close`` unfreezes them)."""
        try:
            return self._warm_up()
        finally:
            freeze_survivors()

    def _warm_up(self) -> int:
        with phase("warm_up"):
            c, g = self.cfg, self.cfg.grpo
            longest = {step: max(len(chat_prompt(self.tok, p.prompt_text)) for p in self.train_problems(step))
                       for step in range(self.start_step, c.steps)} if self.math is not None else {}
            # the update's microbatches: at most grpo.microbatch rows of up to the longest prompt + answer tokens
            # (multi-turn workloads: their prompts are not known here, 16 tokens stands in for them)
            self.update.prepare(min(g.microbatch, g.rows_per_step),
                                max(longest.values(), default=16) + g.max_new_tokens, batch_rows=g.rows_per_step)
            if c.rollout_backend != "suite" or self.engine.static_decoder is None or self.start_step >= c.steps:
                return 0
            if self.policy.device.type == "cuda":
                # the update's compile leaves its activations cached in the ordinary pool, which the captures below
                # cannot use (on one H100 a fig3 row's first propose capture ran out of memory with 37.8 GiB cached
                # there, and succeeded on its retry after releasing it): hand it back before capturing
                torch.cuda.empty_cache()
            if self.math is None:
                return self._warm_up_turns()
            first_step: dict = {}
            for step, n in longest.items():
                shape = self.engine.request_shape(g.rows_per_step, n, g.max_new_tokens)
                first_step.setdefault(shape, step)
            for step in first_step.values():      # each for every step its request can take (see the docstring)
                self.rollout(step, every_step=True)
            if first_step:     # the validation's request (greedy, held-out problems), which the first step meets
                self.rollout(self.start_step, split="heldout", greedy=True, every_step=True)
            return len(first_step)

    def _warm_up_turns(self) -> int:
        """``warm_up``'s rollouts for multi-turn episodes (the workplace workload), whose turns' prompts are known
        only as they run: ``RolloutEngine.warm_up`` for every request a turn can make up to a bound, the training
        turns' (``rows_per_step`` rows, sampled) and the validation's (greedy). A turn's prompt is at most the
        longest task prompt, the tokens its episode wrote before it (fewer than ``max_new_tokens``) and
        ``max_tool_calls`` observations of up to ``OBSERVATION_TOKENS``; a longer one captures in its step (logged
        and counted as any). Returns the requests run."""
        c, g = self.cfg, self.cfg.grpo
        stops = (self.tok.eos_id, self.tok.call_end_id)        # workplace_rollout's, so the same graphs

        def bound(tasks) -> int:
            first = max(len(chat_prompt(self.tok, t.prompt_text)) for t in tasks)
            return first + g.max_new_tokens - 1 + c.workload.max_tool_calls * OBSERVATION_TOKENS

        train = [t for step in range(self.start_step, c.steps)
                 for t in self.workplace.tasks("train", g.prompts_per_step, draw=step)]
        ran = self.engine.warm_up(g.rows_per_step, bound(train), g.max_new_tokens, greedy=False,
                                  temperature=g.temperature, stop_tokens=stops)
        held_out = self.workplace.tasks("heldout", c.workload.val_size)
        return ran + self.engine.warm_up(len(held_out), bound(held_out), g.max_new_tokens, greedy=True,
                                         temperature=1.0, stop_tokens=stops)

    def train_step(self, step: int) -> tuple[dict[str, float], RolloutBatch, UpdateStats]:
        checkpoint_wait = wait_for_writes()      # no checkpoint write of this process runs beside the timed step
        graphs0, start_us, gc0 = _compiled_graphs(), time.time_ns() // 1000, collector_seconds()
        captures0 = GraphedCallable.total_captures
        t0, c0 = time.perf_counter(), time.process_time()
        with phase("step.rollout"):
            batch = self.rollout(step)
        c1 = time.process_time()
        adv = group_advantages(batch.rewards, self.cfg.grpo.generations_per_prompt, self.cfg.grpo.normalize_std)
        allocs0 = _device_alloc_calls()
        with phase("step.update"):
            stats = self.update.step(batch, adv, anchor_seed=self.cfg.rollout_seed * 7919 + step,
                                     temperature=self.cfg.grpo.temperature)
        c2 = time.process_time()
        with phase("step.push"):
            push_s, _ = self.push()
        self._manual_gc(step)
        step_time = time.perf_counter() - t0
        # CPU seconds of this process (plus the tools' latency, which is wall time by design): on a
        # shared CPU machine these are not inflated by other processes, unlike the wall times
        m = step_metrics(self.cfg, batch, stats, push_s=push_s, step_time=step_time,
                         rollout_cpu=(c1 - c0) + batch.tool_time_s, update_cpu=c2 - c1,
                         step_cpu=(time.process_time() - c0) + batch.tool_time_s)
        m["train/gc_s"] = collector_seconds() - gc0      # the garbage collector's share of the step's time
        if self.cfg.ckpt_every:          # outside the step's times: the wait for a checkpoint write before it
            m["train/checkpoint_wait_s"] = checkpoint_wait
        if allocs0 is not None:      # cudaMalloc calls the update made: ~0 once the caching allocator is warm
            m["train/update_device_allocs"] = _device_alloc_calls() - allocs0
        if self.cfg.cuda_graphs != "off" or (self.cfg.draft is not None and self.cfg.draft.cuda_graph):
            m["train/graph_captures"] = GraphedCallable.total_captures     # running count in this process
            # CUDA graphs captured in this step: a step averaged by the tables should capture none (warm_up
            # captures what the run's requests can meet; repro.rl.summary counts the steps that did)
            m["train/step_graph_captures"] = GraphedCallable.total_captures - captures0
            if m["train/step_graph_captures"] and step > 0:
                log.warning("%s step %d captured CUDA graphs: %s", self.cfg.row, step,
                            ", ".join(GraphedCallable.captured[captures0:]))
        # graphs dynamo compiled during this step (rollout engine, compiled update, drafts): a step averaged by the
        # tables should compile none (repro.rl.summary counts those that did)
        m["train/compiled_graphs"] = _compiled_graphs() - graphs0
        if m["train/compiled_graphs"] and step > 0:     # named in the run's log: which code met a new shape or path
            log.warning("%s step %d compiled: %s", self.cfg.row, step,
                        "; ".join(compiled_frames_since(start_us)) or "(frames not recorded)")
        m.update(device_memory_metrics())
        return m, batch, stats

    def _manual_gc(self, step: int) -> None:
        """With ``manual_gc_interval`` N: Python's automatic collector off while training (``close`` turns it back
        on), one full collection after every N-th step, inside the step (its time is in ``train/gc_s``)."""
        n = self.cfg.manual_gc_interval
        if not n:
            return
        gc.disable()
        if (step + 1) % n == 0:
            gc.collect()

    # -- checkpoints -------------------------------------------------------------------------------------
    @functools.cached_property
    def warm_digest(self) -> str:
        """Digest of the warm start's weights: a checkpoint made from other weights is not resumed."""
        return warm_start_digest(self.cfg.warm_start)

    def save(self, step: int) -> None:
        state = {"policy": self.policy.model.state_dict(), "optimizer": self.update.state_dict()}
        if self.draft is not None:
            state["draft"] = self.draft.state_dict()
        self.checkpoints.save(step, state, self.cfg.to_dict(), self.warm_digest)
        self.saved_step = step

    def save_after_stop(self) -> bool:
        """A stopped run (repro.rl.stop): checkpoint the state after the last step this process finished, unless that
        is the run's last step (its run record follows) or already checkpointed. Returns whether it saved."""
        step = self.last_done
        if step is None or step == self.cfg.steps - 1 or step == self.saved_step:
            return False
        self.save(step)
        return True

    def try_resume(self, restart_on_config_change: bool = False) -> int:
        """Load the run folder's last checkpoint; returns the first step still to run (0 if none)."""
        state = load_checkpoint(self.cfg.out, self.cfg.to_dict(), self.warm_digest, restart_on_config_change)
        if state is None:
            return 0
        self.policy.model.load_state_dict(state["policy"])
        if self.draft is not None:
            self.draft.load_state_dict(state["draft"])
        self.update.load_state_dict(state["optimizer"])
        self.push()
        self.start_step = state["step"] + 1
        return self.start_step

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self, logger, *, on_step: Callable[[int, dict], None] | None = None,
            stop: StopOnSignal | None = None) -> list[dict[str, float]]:
        """Every step still to run; under ``stop``, a requested stop ends the loop after the step in flight with
        the state checkpointed (the rows run so far are returned)."""
        rows = []
        try:
            for step in range(self.start_step, self.cfg.steps):
                rows.append(self.run_step(step, logger, on_step))
                if stop is not None and stop.requested:
                    self.save_after_stop()
                    break
            return rows
        finally:
            self.close()

    def run_step(self, step: int, logger, on_step: Callable[[int, dict], None] | None = None) -> dict[str, float]:
        """One logged step: train, validate when due, log, checkpoint when due (repro.rl.lockstep calls this)."""
        cfg = self.cfg
        m, _, _ = self.train_step(step)
        last = step == cfg.steps - 1
        if step % cfg.workload.val_every == 0 or last:
            tv = time.perf_counter()
            m["val/accuracy"] = self.validate(step)
            m["val/time_s"] = time.perf_counter() - tv
        logger.log(m, row=cfg.row, step=step)
        self.last_done = step
        if checkpoint_due(cfg, step):
            self.save(step)
        if on_step is not None:
            on_step(step, m)
        if self.progress is None:
            self.progress = Progress(cfg.steps, f"[{cfg.artifact} {cfg.row}]", done=step, every_s=0)
        self.progress.update(info=f"reward {m['train/reward']:.3f} "
                             + (f"AL {m['train/acceptance_length']:.2f} " if "train/acceptance_length" in m else "")
                             + f"rollout {m['train/rollout_time_s']:.2f}s update {m['train/update_time_s']:.2f}s "
                             f"kl {m['train/train_inference_kl']:.2e}")
        return m

    def close(self) -> None:
        """End of training: wait for the checkpoint being written, stop the workplace tools' thread pool (a later
        rollout makes a new one) and give garbage collection back to Python (``manual_gc_interval`` turned it off;
        ``warm_up`` froze the objects it left alive); a failed checkpoint write is raised after the rest is done."""
        try:
            self.checkpoints.close()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            gc.unfreeze()
            if self.cfg.manual_gc_interval:
                gc.enable()
