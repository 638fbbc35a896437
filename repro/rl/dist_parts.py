"""Pieces the distributed joint updates share (``repro.rl.pp``, ``repro.rl.cp``, ``repro.rl.mesh_update``).

* ``stage_to_hf``: a pipeline stage's parameter name -> the HF model's.
* ``tap_sources`` / ``read_remote_taps`` / ``release_after_backward``: the draft stage's side of
  TapChannel around a ``torch.distributed.pipelining`` stage (which stage ships which tap, reading a
  microbatch's slots before the draft runs, returning them after that microbatch's backward).
* ``clip_across``: the policy's global gradient norm when its parameters are spread over ranks
  (squared norms summed over a group in fp64), clipped like ``torch.nn.utils.clip_grad_norm_``.
* ``allreduce_grads``: gradients summed over a group in one flat buffer per parameter list.
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
    dev = params[0].device if params else torch.device("cpu")
    sq = torch.zeros(1, dtype=torch.float64, device=dev)
    for p in params:
        if p.grad is not None:
            sq += p.grad.double().pow(2).sum()
    if group is not None:
        dist.all_reduce(sq, group=group)
    norm = float(sq.sqrt())
    coef = min(1.0, max_norm / (norm + 1e-6))
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return norm


def allreduce_grads(params, group) -> None:
    """Sum ``params``' gradients over ``group`` (missing gradients count as zero) in one flat buffer."""
    if group is None or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


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
