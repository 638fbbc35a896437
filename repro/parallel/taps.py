"""Forward hooks that feed the policy's taps into a TapChannel, keyed by (step, microbatch).

``TapRouter`` owns the hooks of one rank's stage modules. The microbatch a stage is running comes
from wrapping ``PipelineStage.forward_one_chunk`` on the stage *instance* (the schedule classes are
untouched) and is cross-checked against a per-stage forward counter. Taps produced on a source
stage go out through ``TapChannel.put`` (detached, flattened to ``[tokens, hidden]``); taps produced
on the draft's own stage stay in a local dict. With ``inschedule_dst`` set (the negative control,
NeMo-RL's way today) taps are sent with blocking ``send`` on the pipeline's own group instead. Tap
names: ``embed`` for the embedding (tap -1), ``L<l>`` for the output of decoder layer ``l``.
"""
from __future__ import annotations

import torch

from kernels.transport import TapChannel, sequence_stamp
from repro.parallel.draft_interface import EMBED_TAP


def tap_name(tap: int) -> str:
    return "embed" if tap == EMBED_TAP else f"L{tap}"


class TapRouter:
    """Hooks on tap layers of this rank's stages; see the module docstring."""

    def __init__(self, channel: TapChannel | None, n_microbatches: int, draft_stage: int,
                 inschedule_dst: int | None = None):
        self.channel, self.n_mb, self.draft_stage = channel, n_microbatches, draft_stage
        self.inschedule_dst = inschedule_dst  # negative control: blocking send on the pipeline's group
        self.step = 0
        self.current: dict[int, int] = {}
        self._count: dict[int, int] = {}
        self.local: dict[int, dict[int, torch.Tensor]] = {}  # seq -> tap -> [b, s, H] (draft's own stage)
        self._handles = []

    def seq(self, stage: int) -> int:
        return sequence_stamp(self.step, self.current[stage], self.n_mb)

    def track(self, stage_idx: int, pipe_stage) -> None:
        """Wrap ``pipe_stage.forward_one_chunk`` to record the microbatch it is running."""
        original = pipe_stage.forward_one_chunk
        self._count[stage_idx] = 0

        def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
            expected = self._count[stage_idx] % self.n_mb
            if fwd_chunk_id != expected:
                raise RuntimeError(f"stage {stage_idx}: schedule ran microbatch {fwd_chunk_id}, the forward "
                                   f"counter expected {expected}; the tap stamps would be wrong")
            self._count[stage_idx] += 1
            self.current[stage_idx] = fwd_chunk_id
            return original(fwd_chunk_id, *args, **kwargs)

        pipe_stage.forward_one_chunk = forward_one_chunk

    def hook(self, stage_idx: int, module: torch.nn.Module, tap: int) -> None:
        """Ship ``module``'s output as tap ``tap`` of stage ``stage_idx`` for the running microbatch."""
        name = tap_name(tap)

        def fwd_hook(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            feat = out.detach()
            seq = self.seq(stage_idx)
            if stage_idx == self.draft_stage:
                self.local.setdefault(seq, {})[tap] = feat
            elif self.inschedule_dst is not None:
                if self.inschedule_dst == torch.distributed.get_rank():
                    self.local.setdefault(seq, {})[tap] = feat
                else:
                    torch.distributed.send(feat.contiguous(), dst=self.inschedule_dst)
            else:
                self.channel.put(stage_idx, name, seq, feat.reshape(-1, feat.shape[-1]))

        self._handles.append(module.register_forward_hook(fwd_hook))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
