"""How a decoder's layers are cut into pipeline stages, and which stage produces which tap.

Pure Python (no transformers import), shared by the PP harness and the Figure 7 benchmark.
Tap convention: ``repro.parallel.draft_interface`` (tap l = output of layer l; -1 = embedding).
"""
from __future__ import annotations


def split_layers(num_layers: int, num_stages: int, first: int | None = None, last: int | None = None
                 ) -> list[range]:
    """Contiguous layer ranges per stage; ``first``/``last`` pin the first/last stage's counts
    (Megatron's ``num_layers_in_{first,last}_pipeline_stage``), the rest split as evenly as possible."""
    if num_stages < 1:
        raise ValueError(f"num_stages={num_stages}: expected >= 1")
    if num_stages == 1:
        return [range(num_layers)]
    counts = [0] * num_stages
    rest, middle = num_layers, list(range(num_stages))
    for idx, fixed in ((0, first), (num_stages - 1, last)):
        if fixed is not None:
            counts[idx] = fixed
            rest -= fixed
            middle.remove(idx)
    if rest < len(middle) or any(c < 0 for c in counts):
        raise ValueError(f"{num_layers} layers cannot fill {num_stages} stages with first={first}, "
                         f"last={last}: every stage needs at least one layer")
    for i, idx in enumerate(middle):
        counts[idx] = rest // len(middle) + (1 if i < rest % len(middle) else 0)
    if any(c < 1 for c in counts):
        raise ValueError(f"{num_layers} layers over {num_stages} stages leaves a stage without "
                         f"layers: {counts}")
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def stage_of_tap(tap: int, ranges: list[range]) -> int:
    """The stage producing tap ``tap`` (output convention; -1 = embedding, made on stage 0)."""
    if tap == -1:
        return 0
    for s, r in enumerate(ranges):
        if tap in r:
            return s
    raise ValueError(f"tap {tap} is not the output of any layer in {[(r.start, r.stop) for r in ranges]}")
