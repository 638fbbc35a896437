"""Single-process reference of the PP harness: the same stage modules, microbatches, taps and losses,
run one microbatch at a time on one process (no pipeline, no channel). Gradients accumulate over
microbatches and steps exactly as the pipelined run accumulates them (``scale_grads=False``).

    .venv/bin/python -m repro.parallel.reference      # prints per-microbatch losses of a PP=2 config
"""
from __future__ import annotations

import torch

from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.parallel.harness import PPConfig, build, policy_loss, step_batch


def run_reference(cfg: PPConfig) -> dict:
    torch.manual_seed(cfg.seed)
    mcfg, stages, draft, _ranges, taps = build(cfg)
    captured: dict[int, torch.Tensor] = {}
    handles = []
    for tap, s in taps.items():
        mod = stages[s].embed_tokens if tap == -1 else stages[s].layers[str(tap)]
        handles.append(mod.register_forward_hook(
            lambda _m, _i, out, tap=tap: captured.__setitem__(
                tap, (out[0] if isinstance(out, tuple) else out).detach())))
    per_mb = []
    for step in range(cfg.steps):
        batch = step_batch(cfg, mcfg.vocab_size, step)
        for mb, ids in enumerate(batch.split(cfg.mb_size)):
            captured.clear()
            h = ids
            for st in stages:
                h = st(h)
            lp = policy_loss(h, ids)
            row = {"step": step, "mb": mb, "seq": step * cfg.n_microbatches + mb, "policy_loss": lp.item()}
            loss = lp
            if draft is not None:
                dl = draft.draft_loss(TargetFeatures(dict(captured)),
                                      DraftBatch(ids, torch.ones_like(ids, dtype=torch.float32), h.detach()))
                row["draft_loss"] = dl.item()
                row["taps"] = {t: v.clone() for t, v in captured.items()}
                loss = lp + cfg.lam * dl
            loss.backward()
            per_mb.append(row)
    for hd in handles:
        hd.remove()
    grads = {f"stage{s}.{n}": p.grad.clone() for s, st in enumerate(stages) for n, p in st.named_parameters()
             if p.grad is not None}
    if draft is not None:
        grads.update({f"draft.{n}": p.grad.clone() for n, p in draft.named_parameters()
                      if p.grad is not None})
    return {"per_mb": per_mb, "grads": grads}


if __name__ == "__main__":
    out = run_reference(PPConfig(pp=2))
    for r in out["per_mb"]:
        print({k: v for k, v in r.items() if k != "taps"})
