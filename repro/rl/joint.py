"""The joint update: L = L_RL(theta) + lambda * L_draft(phi; x, sg(H_theta(x))), one backward, two groups.

``JointUpdate.step(batch)`` runs the policy over the rollout batch in microbatches: one forward gives
the logits (GRPO's clipped loss against the rollout log-probabilities) and the detached taps; the
draft's loss on those taps (and on the detached policy logits, its teacher) is added with weight
``lambda`` and the sum is backpropagated once. The policy and the draft are two parameter groups of
one AdamW, each with its own learning rate and its own gradient-norm clipping (NeMo-RL's separate
``draft`` grad-norm group). Because the taps, the teacher and the block drafts' view of the
embedding/head are all stop-gradient, the draft loss never reaches the policy: with lambda = 0 the
policy's update is bit-identical to the no-draft baseline's (tests/rl/test_joint.py).

With ``draft.cuda_graph`` (block drafts, deferred pass) the draft's loss and backward replay as a CUDA graph
(``repro.rl.draft_graph``); the policy's side is unchanged.

``autocast_dtype`` (e.g. bfloat16 on a GPU) runs the forward passes under ``torch.autocast``: bf16
compute on fp32 master weights, as Megatron-based trainers do; None (the default, and every CPU
profile) computes in the parameters' dtype.

    upd = JointUpdate(policy, draft, grpo_spec, draft_spec)
    stats = upd.step(rollout_batch, advantages)
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.profiler import record_function as phase  # named ranges for torch.profiler (studies/rl_profile)

from kernels.attention.sdpa_choice import no_cudnn_sdpa
from repro.core.specs import DraftSpec, GRPOSpec
from repro.core.timing import StreamSpan
from repro.models.moe_experts import compiles_whole
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.rl.draft_graph import DraftTrainStep, pad_rows
from repro.rl.drafts import trainable_parameters
from repro.rl.episodes import RolloutBatch, right_padded
from repro.rl.grpo import clipped_policy_loss, token_logprobs, train_inference_kl_sum
from repro.rl.warmstart import autocast_or_off, check_autocast_dtype
from repro.rollout.compiled_layers import compiled_layers

# the update's statistics, summed on the device over its microbatches (index in one float64 vector)
_SUMS = {name: i for i, name in enumerate(("policy_loss", "draft_loss", "clip", "kl_ref", "train_inference_kl",
                                           "policy_grad_norm", "draft_grad_norm"))}
# the compiled update's policy forward runs on rows right-padded to a multiple of this many tokens. Why: on CUDA,
# inductor's SDPA lowering guards the graph on whether the sequence length is a multiple of 8 (the attention inputs'
# stride alignment), so a graph compiled on one kind of length is compiled again by the first batch of the other
# kind (a 19-22 s update in step 0 of each process's first row in Table 1's h100 run at 5b96677). Padded, every batch
# is of one kind. The pads' outputs are dropped before the losses: the update sees the batch's own length.
LENGTH_MULTIPLE = 8


def aligned_length(length: int) -> int:
    """``length`` rounded up to a multiple of ``LENGTH_MULTIPLE``."""
    return -(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


@dataclass
class UpdateStats:
    policy_loss: float
    draft_loss: float
    policy_grad_norm: float
    draft_grad_norm: float
    train_inference_kl: float
    clip_frac: float
    update_time_s: float
    draft_time_s: float            # the draft's span in the update (forward + loss; + backward when deferred),
                                   # timed on the device's stream (CUDA events) on a GPU
    kl_ref: float = 0.0


def draft_loss_mask(token_mask: torch.Tensor) -> torch.Tensor:
    """Prediction mask of the drafts: position t counts when token t+1 was written by the policy."""
    out = torch.zeros_like(token_mask)
    out[:, :-1] = token_mask[:, 1:]
    return out


def joint_optimizer(params, dparams, grpo: GRPOSpec, draft: DraftSpec | None) -> torch.optim.AdamW:
    """The joint update's AdamW: a policy group and (if any) a draft group, each with its learning rate
    (also built by the distributed updates, repro.rl.pp / mesh_update, on each rank's parameters)."""
    groups = [{"params": params, "lr": grpo.lr, "name": "policy"}]
    if dparams:
        groups.append({"params": dparams, "lr": draft.lr, "name": "draft"})
    return torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def set_draft_lr(optimizer: torch.optim.Optimizer, draft: DraftSpec | None) -> None:
    """Before ``optimizer.step()``: the draft group's learning rate of this update, ``draft.lr`` ramped linearly
    over ``draft.lr_warmup_steps`` updates. The count is the optimizer's own (AdamW's per-parameter ``step``), so a
    run resumed from its checkpointed optimizer continues the ramp where it stopped.

    Why: Adam's bias-corrected first step is about lr * sign(g) for every parameter, however small g is; on a
    warm-started draft at the co-training lr that shock undid half of its acceptance on the H200 (DFlash AL 3.93
    -> 1.84 after the first update, results/2xh200/h200/dist/warm_start)."""
    if draft is None or not draft.lr_warmup_steps:
        return
    for group in optimizer.param_groups:
        if group.get("name") == "draft" and group["params"]:
            done = float(optimizer.state.get(group["params"][0], {}).get("step", 0.0))
            group["lr"] = draft.lr * min(1.0, (done + 1.0) / draft.lr_warmup_steps)


class JointUpdate:
    """One optimizer (policy group + draft group), per-group clipping, GRPO + lambda * draft loss. Under
    ``grpo.compile_layers`` the policy's decoder layers run compiled (``COMPILE_BACKEND``) in the update's forward,
    so AOTAutograd's compiled backward runs in its backward. An MoE policy's layers compile only where its experts
    run bf16/fp16 grouped GEMMs under the update's autocast (``repro.models.moe_experts.compiles_whole``); else
    its update runs eagerly (on fp32 weights transformers' expert kernels read their group offsets on the host,
    which breaks inductor's graph at every layer)."""

    COMPILE_BACKEND = "inductor"

    def __init__(self, policy, draft: nn.Module | None, grpo: GRPOSpec, draft_spec: DraftSpec | None,
                 reference=None, autocast_dtype: torch.dtype | None = None):
        check_autocast_dtype(autocast_dtype)
        if (draft is None) != (draft_spec is None):
            raise ValueError("give both the draft and its DraftSpec, or neither")
        if grpo.kl_coef and reference is None:
            raise ValueError(f"grpo.kl_coef={grpo.kl_coef} needs a frozen reference policy")
        self.policy, self.draft, self.grpo, self.draft_spec = policy, draft, grpo, draft_spec
        self.reference = reference
        self.autocast_dtype = autocast_dtype
        self.compile_layers = grpo.compile_layers and (not policy.has_experts
                                                   or compiles_whole(policy.model, autocast_dtype))
        if grpo.compile_layers and not self.compile_layers:
            print("grpo.compile_layers: the MoE policy's update runs eagerly (its experts run fp32 GEMMs here, "
                  "whose host syncs break inductor's graph; they compile under bf16/fp16 autocast)", file=sys.stderr)
        self.policy_params = [p for p in policy.parameters() if p.requires_grad]
        self.draft_params: list[nn.Parameter] = trainable_parameters(draft) if draft is not None else []
        self.optimizer = joint_optimizer(self.policy_params, self.draft_params, grpo, draft_spec)
        self.draft_step = (DraftTrainStep(draft, cuda_graphs=True)
                           if draft_spec is not None and draft_spec.cuda_graph else None)
        self._graph_compiled = False
        self._draft_step_prepared = False

    def _features(self, taps) -> TargetFeatures:
        spec = self.policy.tap_spec
        return TargetFeatures(dict(zip(spec.as_output_layers(), taps)))

    def step(self, batch: RolloutBatch, advantages: torch.Tensor, *, anchor_seed: int = 0,
             temperature: float = 1.0) -> UpdateStats:
        t0 = time.perf_counter()
        dev = self.policy.device
        ids = batch.input_ids.to(dev)
        # right padding: causal attention alone gives each real position what the padding mask would (no real query
        # sees a later, padded key), and without a mask SDPA takes its flash kernel instead of the masked
        # memory-efficient one (a third of the update's device time on an H100). Padded positions carry no loss.
        att = None if right_padded(batch.attention_mask) else batch.attention_mask.to(dev)
        mask = batch.loss_mask.to(dev)
        old = batch.rollout_logp.to(dev)
        adv = advantages.to(dev)
        n_tok = float(batch.loss_mask.sum())       # the batch's host copy: no wait on the device
        if n_tok == 0:
            raise ValueError("rollout batch has no policy-written tokens to train on")
        B, mb = ids.shape[0], self.grpo.microbatch
        lam = self.draft_spec.loss_weight if self.draft_spec is not None else 0.0
        gen = torch.Generator().manual_seed(anchor_seed)
        self.prepare(min(B, mb), ids.shape[1])     # the first step's own shape, where no warm-up came first
        self.optimizer.zero_grad(set_to_none=True)
        # the statistics stay on the device until the step is done: one host sync per update, not several per
        # microbatch (a sync drains the GPU's queue, which the host then refills from empty)
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=dev)
        draft_spans: list[StreamSpan] = []
        amp = autocast_or_off(dev.type, self.autocast_dtype)
        kept = [] if self._defers_draft(mb) else None    # the microbatches' detached taps and logits
        for s in range(0, B, mb):
            sl = slice(s, min(B, s + mb))
            with amp, no_cudnn_sdpa(dev), phase("update.policy_forward"):   # no cuDNN: new lengths every batch
                loss, total, logp, st, d_mb = self._microbatch(ids, att, mask, old, adv, sl, n_tok, temperature,
                                                               gen, lam, B, kept)
            if d_mb is not None:
                draft_spans.append(d_mb[0])
                sums[_SUMS["draft_loss"]] += d_mb[1]
            with no_cudnn_sdpa(dev), phase("update.policy_backward"):
                total.backward()
            sums[_SUMS["policy_loss"]] += loss.detach().double()
            sums[_SUMS["clip"]] += st["clip_frac"].double()
            if "kl_ref_sum" in st:
                sums[_SUMS["kl_ref"]] += st["kl_ref_sum"].double()
            sums[_SUMS["train_inference_kl"]] += train_inference_kl_sum(logp.detach(), old[sl], mask[sl])
        if kept is not None:
            with no_cudnn_sdpa(dev), phase("update.draft"):
                span, d_loss = self._deferred_draft(kept, ids, mask, gen, lam, B, amp)
            draft_spans.append(span)
            sums[_SUMS["draft_loss"]] += d_loss
        with phase("update.clip_and_step"):
            sums[_SUMS["policy_grad_norm"]] += torch.nn.utils.clip_grad_norm_(self.policy_params,
                                                                               self.grpo.max_grad_norm).double()
            if self.draft_params:
                sums[_SUMS["draft_grad_norm"]] += torch.nn.utils.clip_grad_norm_(
                    self.draft_params, self.draft_spec.max_grad_norm).double()
            set_draft_lr(self.optimizer, self.draft_spec)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            got = dict(zip(_SUMS, sums.tolist()))       # the update's one host sync: it waits for the step
        return UpdateStats(policy_loss=got["policy_loss"], draft_loss=got["draft_loss"],
                           policy_grad_norm=got["policy_grad_norm"], draft_grad_norm=got["draft_grad_norm"],
                           train_inference_kl=got["train_inference_kl"] / n_tok, clip_frac=got["clip"] / n_tok,
                           update_time_s=time.perf_counter() - t0,
                           draft_time_s=sum(span.seconds() for span in draft_spans),
                           kl_ref=got["kl_ref"] / n_tok)

    def prepare(self, rows: int, length: int, batch_rows: int = 0) -> None:
        """Compile the update's graph now, if it compiles its layers and has not yet (the first ``step`` does it
        otherwise, on its own batch's shape): a trainer calls it before its first timed step with the shape of the
        microbatches to come (``rows`` of ``length`` tokens), so that a resumed run compiles outside it. With
        ``batch_rows`` (the rows of a step's batch) and a graphed deferred draft step, that step's graphs are
        captured too (``_prepare_draft_step``)."""
        if self.compile_layers and not self._graph_compiled:
            self._compile_update_graph(self.policy.device, *self.compile_shape(rows, length))
        if batch_rows and self.draft_step is not None and self._defers_draft(self.grpo.microbatch) \
                and not self._draft_step_prepared:
            self._prepare_draft_step(min(batch_rows, self.draft_spec.microbatch), length)

    def _prepare_draft_step(self, rows: int, length: int) -> None:
        """Capture the graphed draft step (``repro.rl.draft_graph``, one graph per sequence bucket) for the two
        longest buckets a batch of at most ``length`` tokens falls in, on ``rows`` rows (the deferred pass's call)
        of the policy's taps and logits for a token-index batch, at weight 0; the gradients are dropped. Why: a
        batch that first meets a bucket otherwise captures inside a timed step (a draft pass of 0.093 s against
        0.016 s in step 8 of Qwen3-8B/DSpark in Table 1's h100 run at 5b96677)."""
        dev, step = self.policy.device, self.draft_step
        top = step.bucket_length(length)
        amp = autocast_or_off(dev.type, self.autocast_dtype)
        for n in (top - step.seq_bucket, top):
            if n < 2:
                continue
            ids = self._token_index_rows(rows, n)
            # grad enabled, as in a step: a no-grad forward would compile the layers' inference graph too
            with amp, no_cudnn_sdpa(dev):
                logits, taps = self._policy_forward(ids, None)
            fused = self._features([t.detach() for t in taps]).concat(self.draft.tap_layers)
            logits = logits.detach()
            del taps
            mask = draft_loss_mask(torch.ones(rows, n, device=dev))        # float32, as a rollout batch's
            with no_cudnn_sdpa(dev):
                step(ids, mask, logits, fused, torch.Generator().manual_seed(0), weight=0.0,
                     autocast_dtype=self.autocast_dtype)
        self.optimizer.zero_grad(set_to_none=True)
        self._draft_step_prepared = True

    def compile_shape(self, rows: int, length: int) -> tuple[int, int]:
        """(rows, length) near the given ones that equal no size of the policy's config and not each other (at least
        2), the length a multiple of ``LENGTH_MULTIPLE`` as the steps' padded lengths are. Why near the real ones:
        inductor guards the graph on choices it makes from the first call's sizes (on a CPU, ``2 * rows * length <=
        4096`` from one of 3 x 11 tokens), so a graph compiled on a toy batch is compiled again by the first real
        one. Why distinct: dynamo's duck sizing ties equal sizes to one symbol, and a later batch whose sizes differ
        would fail that guard."""
        cfg = self.policy.model.config
        taken = {v for k, v in vars(cfg).items() if isinstance(v, int) and not isinstance(v, bool)
                 and (k.endswith("_size") or k.startswith("num_") or k == "head_dim")}
        rows = max(2, rows)
        while rows in taken:
            rows += 1
        length = aligned_length(max(2, length))
        while length in taken or length == rows:
            length += LENGTH_MULTIPLE
        return rows, length

    def _compile_update_graph(self, dev: torch.device, rows: int, length: int) -> None:
        """Compile the graph the compiled layers take for a right-padded microbatch (no mask: SDPA's causal path),
        as a microbatch runs it, forward and backward, on ``rows`` x ``length`` tokens; the gradients are dropped.
        Every rollout batch is right-padded (``repro.rl.episodes``), so the masked graph is not made: a batch
        padded otherwise would compile it in the step that first meets it, inside the steps the tables average
        (22 s in one update on the H200; the summary counts such steps)."""
        with autocast_or_off(dev.type, self.autocast_dtype), no_cudnn_sdpa(dev):
            logits, _ = self._policy_forward(self._token_index_rows(rows, length), None)
        with no_cudnn_sdpa(dev):
            logits.float().mean().backward()
        self.optimizer.zero_grad(set_to_none=True)
        self._graph_compiled = True

    def _token_index_rows(self, rows: int, length: int) -> torch.Tensor:
        """A stand-in batch ``[rows, length]`` for the warm-up's compiles and captures: token ids 0, 1, 2, ..."""
        return torch.arange(rows * length, device=self.policy.device).view(rows, length) % self.policy.vocab_size

    def _draft_loss(self, ids, mask, policy_logits, taps, gen) -> torch.Tensor:
        """The draft's loss on rows ``ids`` given the policy's (detached) logits and taps of those rows."""
        dbatch = DraftBatch(input_ids=ids, loss_mask=draft_loss_mask(mask), policy_logits=policy_logits,
                            extras={"anchor_generator": gen})
        return self.draft.draft_loss(self._features(taps), dbatch)

    def _defers_draft(self, policy_microbatch: int) -> bool:
        """Whether the draft runs after the policy's microbatches, over chunks of ``draft_spec.microbatch`` rows."""
        return self.draft is not None and self.draft_spec.microbatch > policy_microbatch

    def _deferred_draft(self, kept, ids, mask, gen, lam, B, amp) -> tuple[StreamSpan, torch.Tensor]:
        """The draft's loss and backward over the whole batch's kept (detached) taps, ``draft_spec.microbatch``
        rows per call, each weighted by its share of the batch as in the per-microbatch path; returns (its span,
        weighted draft loss as a float64 tensor). Same step, same optimizer step: only the draft's call boundaries
        move."""
        span = StreamSpan(self.policy.device)
        taps = [torch.cat(parts) for parts in zip(*(t for _, t, _ in kept))]
        logits = torch.cat([lg for _, _, lg in kept])
        rows, d_loss = self.draft_spec.microbatch, 0.0
        for s in range(0, B, rows):
            sl = slice(s, min(B, s + rows))
            frac = (sl.stop - sl.start) / B
            if self.draft_step is not None:      # loss + backward as one CUDA graph (repro.rl.draft_graph)
                fused = self._features([t[sl] for t in taps]).concat(self.draft.tap_layers)
                dl = self.draft_step(ids[sl], draft_loss_mask(mask[sl]), logits[sl], fused, gen, weight=lam * frac,
                                     autocast_dtype=self.autocast_dtype)
            else:
                with amp:
                    dl = self._draft_loss(ids[sl], mask[sl], logits[sl], [t[sl] for t in taps], gen)
                (lam * frac * dl).backward()
            d_loss = d_loss + dl.detach().double() * frac
        span.stop()
        return span, d_loss

    def _microbatch(self, ids, att, mask, old, adv, sl, n_tok, temperature, gen, lam, B, kept=None):
        """One microbatch's forward: (policy loss, total loss, log-probs, stats, (the draft's span, weighted
        draft loss) or None). With ``kept`` (a list) the draft does not run here: the microbatch's detached
        taps and logits are appended to it for ``_deferred_draft``."""
        att_mb = None if att is None else att[sl]
        logits, taps = self._policy_forward(ids[sl], att_mb)
        logp = token_logprobs(logits, ids[sl], temperature)
        ref_lp = None
        if self.grpo.kl_coef:
            with torch.no_grad():
                ref_lp = token_logprobs(self.reference.forward_train(ids[sl], want_taps=False,
                                                                     attention_mask=att_mb).logits,
                                        ids[sl], temperature)
        loss, st = clipped_policy_loss(logp, old[sl], adv[sl], mask[sl], n_tok, self.grpo.clip_eps,
                                       ref_lp, self.grpo.kl_coef)
        if self.draft is None:
            return loss, loss, logp, st, None
        if kept is not None:
            kept.append((sl, [t.detach() for t in taps], logits.detach()))
            return loss, loss, logp, st, None
        span = StreamSpan(self.policy.device)
        dl = self._draft_loss(ids[sl], mask[sl], logits.detach(), taps, gen)
        span.stop()
        frac = (sl.stop - sl.start) / B
        return loss, loss + lam * frac * dl, logp, st, (span, dl.detach().double() * frac)

    def _policy_forward(self, ids: torch.Tensor, att: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        """The update's policy forward over rows ``ids [B, S]`` (``att``: their padding mask, or None): (logits, taps,
        empty without a draft), each ``[B, S, ...]``. Compiled, the rows run right-padded to a multiple of
        ``LENGTH_MULTIPLE`` (the compiled graph's kind of length, above) and the pads' outputs are dropped: causal
        attention keeps them out of every real position's."""
        S = ids.shape[1]
        T = aligned_length(S) if self.compile_layers else S
        with compiled_layers(self.policy, self.COMPILE_BACKEND if self.compile_layers else None, purpose="train"):
            out = self.policy.forward_train(pad_rows(ids, T), want_taps=self.draft is not None,
                                            attention_mask=None if att is None else pad_rows(att, T))
        return out.logits[:, :S], [t[:, :S] for t in out.taps or ()]

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
