"""Pieces the distributed joint updates share (``repro.rl.pp``, ``repro.rl.cp``, ``repro.rl.mesh_update``).

* ``stage_to_hf``: a pipeline stage's parameter name -> the HF model's.
* ``tap_sources`` / ``read_remote_taps`` / ``release_after_backward``: the draft stage's side of
  TapChannel around a ``torch.distributed.pipelining`` stage (which stage ships which tap, reading a
  microbatch's slots before the draft runs, returning them after that microbatch's backward).
* ``clip_across``: the policy's global gradient norm when its parameters are spread over the stages of a
  pipeline (``torch.nn.utils.get_total_norm`` per stage, squares summed over the group, as torchtitan's
  ``clip_grad_norm_`` does across PP), clipped by ``torch.nn.utils.clip_grads_with_norm_``.
* ``replicate_over``: a stage (with its draft) under ``DistributedDataParallel`` over the CP group, whose
  bucketed all-reduces *sum* the ranks' gradients (each CP rank's loss is its share of the batch's) and
  overlap the backward of the step's last microbatch (the pipeline schedule runs the others under
  ``no_sync``).
* ``grpo_rows_loss``: GRPO's clipped loss over packed rows (``repro.parallel.cp_batch.grpo_targets``)
  plus the clip count and train-inference KL sum the metrics need.

No module here runs anything by itself; the tests are tests/rl/test_pp.py, test_cp.py, test_mesh_update.py.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from kernels.transport import TapChannel, sequence_stamp
from kernels.transport import TapSpec as ChannelTapSpec
from repro.core.specs import GRPOSpec
from repro.parallel.taps import tap_name
from repro.rl.grpo import clipped_policy_loss, kl_k3


def stage_to_hf(name: str) -> str:
    """A stage parameter name -> the HF model's (``layers.3.mlp...`` -> ``model.layers.3.mlp...``)."""
    return name if name.startswith("lm_head") else f"model.{name}"


def tap_sources(taps: dict[int, int], last: int, rows: int, hidden: int, dtype=torch.float32
                ) -> dict[int, list[ChannelTapSpec]]:
    """TapChannel sources: tap -> producing stage (``taps``) for taps made before stage ``last``."""
    sources: dict[int, list[ChannelTapSpec]] = {}
    for t, s in sorted(taps.items()):
        if s != last:
            sources.setdefault(s, []).append(ChannelTapSpec(tap_name(t), (rows, hidden), dtype))
    return sources


def read_remote_taps(channel: TapChannel, sources, seq: int, shape: tuple[int, ...]) -> tuple[dict, float]:
    """Every remote tap of microbatch ``seq`` (views shaped ``shape + (hidden,)``) and the seconds waited."""
    feats = {}
    t0 = time.perf_counter()
    for s in sources:
        for name, v in channel.get_stage(s, seq).items():
            feats[-1 if name == "embed" else int(name[1:])] = v.view(*shape, -1)
    return feats, time.perf_counter() - t0


def release_after_backward(pipe, channel: TapChannel, sources, stamp_step, n_mb: int) -> None:
    """Wrap ``pipe.backward_one_chunk`` so a microbatch's slots return to their sources after its
    backward (the draft's saved inputs are views of them until then); ``stamp_step()`` -> step."""
    full = pipe.backward_one_chunk

    def backward_one_chunk(bwd_chunk_id, *args, **kwargs):
        res = full(bwd_chunk_id, *args, **kwargs)
        for s in sources:
            channel.release(s, sequence_stamp(stamp_step(), bwd_chunk_id, n_mb))
        return res
    pipe.backward_one_chunk = backward_one_chunk


def clip_across(params, max_norm: float, group=None) -> float:
    """Clip ``params``' gradients by their global norm over ``group`` (every rank holds a disjoint part);
    returns the norm before clipping. Same coefficient as ``clip_grad_norm_``: min(1, max/(norm+1e-6))."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    dev = params[0].device if params else torch.device("cpu")
    total = torch.nn.utils.get_total_norm(grads, 2.0) if grads else torch.zeros((), device=dev)
    if group is not None:
        total = total.pow(2)
        dist.all_reduce(total, group=group)
        total = total.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def _sum_allreduce_hook(group, bucket):
    """DDP communication hook: the ``dist.GradBucket`` summed over ``group`` (DDP's default hook averages).
    No annotations: DDP checks them by identity, and this module's are postponed strings."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def replicate_over(module: torch.nn.Module, group, device: torch.device) -> torch.nn.Module:
    """``module`` replicated over ``group`` by ``DistributedDataParallel`` with summed gradients; the module
    itself without a group (one rank per stage). Its parameters stay the module's own (DDP wraps, it does not
    shard), so optimizers, clipping and weight gathers keep using them."""
    if group is None:
        return module
    import inspect

    from torch.nn.parallel import DistributedDataParallel
    device = torch.device(device)
    # buffers (RoPE's inverse frequencies) are equal on every rank: no broadcast before each forward; torch
    # 2.13 renamed the switch (``broadcast_buffers`` is deprecated there), 2.11 knows only the old name
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    no_buffer_sync = {"forward_sync_buffers": False} if renamed else {"broadcast_buffers": False}
    ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                  process_group=group, **no_buffer_sync)
    ddp.register_comm_hook(group, _sum_allreduce_hook)
    return ddp


def grpo_rows_loss(logits: torch.Tensor, target: torch.Tensor, n_tok: float, grpo: GRPOSpec):
    """GRPO's clipped loss of packed rows: ``logits [T, V]``, ``target [T, 4]`` (next id, mask, rollout
    log-prob, advantage); normalised by the batch's ``n_tok``. Returns the loss and detached sums
    ``{"clip": clipped tokens, "kl": sum of k3 KL(rollout || trainer)}`` over the masked rows."""
    labels, m = target[:, 0].long(), target[:, 1].float()
    old, adv = target[:, 2].float(), target[:, 3].float()
    lp = torch.log_softmax(logits.float() / grpo.temperature, -1).gather(1, labels[:, None])
    # per-token advantages are constant per sequence: the row-wise API takes them as [rows] with T = 1
    loss, st = clipped_policy_loss(lp, old[:, None], adv, m[:, None], n_tok, grpo.clip_eps)
    kl = (kl_k3(old.double(), lp[:, 0].detach().double()) * m.double()).sum()
    return loss, {"clip": float(st["clip_frac"]), "kl": float(kl)}
