"""The supervised warm start of a run: tokenizer, policy SFT on worked demonstrations, drafts trained offline.

RL starts from an instruction-tuned policy and (in the paper) from the draft families' official
checkpoints. Here both are built locally and cached as one workflow artifact folder:

1. the byte-level BPE tokenizer trained on the workloads' text (``tokenizer/``);
2. the policy, supervised on worked demonstrations of the workload (math: one line per operation
   and ``Answer: n``; workplace: the reference tool calls with their observations, loss on the
   policy's own tokens only), then scored greedily on the held-out split (``policy.pt``);
3. each requested draft family trained on the SFT policy's features over fresh demonstrations
   (one policy forward per batch feeds every draft; ``drafts/<family>.pt``).

On a GPU both trainings run under autocast to the profile's ``dtype`` over fp32 weights, as the RL update does
(``repro.rl.warmstart.update_autocast_dtype``); on a CPU in fp32.

``sft.json`` records the losses, the held-out accuracy, the drafts' final losses, timings and provenance. The SFT
settings are the profile's ``rl.sft`` with ``rl.sft.workloads.<workload>`` over them (``repro.rl.config.sft_spec``).
``--heldout-every N`` also scores the held-out split every N steps (``heldout_curve`` in sft.json), to choose how
many steps leave RL room to improve; the evaluations do not change what is trained. ``rl.sft.deterministic: true``
trains the drafts with torch's deterministic kernels (on a GPU the block drafts' offline training is otherwise not
bit-reproducible).

    python -m repro.rl.sft --profile cpu-tiny --policy dense --workload math --drafts eagle3,dflash,dspark \
        --out results/cpu-2c/cpu-tiny/sft/dense-math
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import zlib
from pathlib import Path

import torch

from repro.core.io import write_atomic, write_json_atomic
from repro.core.progress import Progress
from repro.core.provenance import provenance
from repro.core.specs import MATH_OPS, WORKLOADS, ConfigError, DraftSpec, PolicySpec, SFTSpec, require_device, sft_spec
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.rl.drafts import build_draft, trainable_parameters
from repro.rl.episodes import chat_prompt, math_rollout, right_padded, workplace_rollout
from repro.rl.grpo import token_logprobs
from repro.rl.joint import draft_loss_mask
from repro.rl.tasks.math import math_tasks
from repro.rl.tasks.workplace import WorkplaceTaskSet
from repro.rl.tokenizer import WorkloadTokenizer, build_workload_tokenizer
from repro.rl.warmstart import autocast_or_off, draft_file, make_policy, update_autocast_dtype
from repro.rollout.engine import RolloutEngine


def demo_sequence(tok: WorkloadTokenizer, item) -> tuple[list[int], list[float]]:
    """Token ids of a worked demonstration and the mask of the tokens the policy must write."""
    ids = chat_prompt(tok, item.prompt_text)
    mask = [0.0] * len(ids)
    if hasattr(item, "solution_text"):                      # math
        resp = tok.encode(item.solution_text) + [tok.eos_id]
        return ids + resp, mask + [1.0] * len(resp)
    for call, obs in item.demo_turns():                      # workplace
        c = [tok.call_id] + tok.encode(call) + [tok.call_end_id]
        o = [tok.obs_id] + tok.encode(obs) + [tok.obs_end_id]
        ids += c + o
        mask += [1.0] * len(c) + [0.0] * len(o)
    end = tok.encode("done") + [tok.eos_id]
    return ids + end, mask + [1.0] * len(end)


def demo_batch(tok: WorkloadTokenizer, items, device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(ids, attention mask, loss mask) of the demonstrations, right-padded; the attention mask is None (the rows are
    right-padded, so causal attention alone is exact, and SDPA takes its flash kernel instead of the masked one)."""
    seqs = [demo_sequence(tok, it) for it in items]
    T = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), T), tok.pad_id, dtype=torch.long)
    att = torch.zeros(len(seqs), T, dtype=torch.bool)
    mask = torch.zeros(len(seqs), T)
    for i, (s, m) in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = True
        mask[i, :len(m)] = torch.tensor(m)
    return ids.to(device), None if right_padded(att) else att.to(device), mask.to(device)


def _items(workload: str, seed: int, n: int, draw: int, math_ops: tuple[int, int] = MATH_OPS):
    if workload == "math":
        return math_tasks(seed, math_ops).problems("train", n, draw=draw)
    return WorkplaceTaskSet(seed).tasks("train", n, draw=draw)


def heldout_accuracy(policy, tok: WorkloadTokenizer, workload: str, seed: int, n: int = 30,
                     max_new_tokens: int = 64, math_ops: tuple[int, int] = MATH_OPS) -> float:
    """Greedy accuracy on the held-out split; math answers get room for the longest worked solution."""
    if workload == "math":
        problems = math_tasks(seed, math_ops).problems("heldout", n)
        longest = max(len(tok.encode(p.solution_text)) for p in problems) + 8
        eng = RolloutEngine(policy, max_model_len=512 + longest)
        b = math_rollout(eng, tok, problems, group_size=1, max_new_tokens=max(max_new_tokens, longest),
                         temperature=1.0, seed=0, greedy=True)
    else:
        eng = RolloutEngine(policy, max_model_len=512)
        b = workplace_rollout(eng, tok, WorkplaceTaskSet(seed).tasks("heldout", n), group_size=1,
                              max_new_tokens=max_new_tokens, temperature=1.0, seed=0, greedy=True)
    return float(b.rewards.mean())


def sft_policy(policy, tok, workload: str, spec: SFTSpec, seed: int, log_every: int = 50, heldout_every: int = 0,
               heldout_curve: list | None = None, math_ops: tuple[int, int] = MATH_OPS,
               autocast_dtype: torch.dtype | None = None) -> list[float]:
    """Supervise ``policy`` for ``spec.steps`` (its forward under ``autocast_dtype`` autocast when given, over its
    fp32 weights, as the RL update runs on a GPU); with ``heldout_every``, (step, held-out accuracy) pairs after every
    that many steps are appended to ``heldout_curve``."""
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / spec.steps))
    losses = []
    bar = Progress(spec.steps, f"[sft {workload}] policy")
    for step in range(spec.steps):
        ids, att, mask = demo_batch(tok, _items(workload, seed, spec.batch, draw=10_000 + step, math_ops=math_ops),
                                    policy.device)
        with autocast_or_off(policy.device.type, autocast_dtype):
            out = policy.forward_train(ids, want_taps=False, attention_mask=att)
        lp = token_logprobs(out.logits.float(), ids)
        loss = -(lp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.update(info=f"loss {losses[-1]:.4f}")
        if log_every and step % log_every == 0:
            print(f"[sft] step {step}: loss {losses[-1]:.4f}", flush=True)
        if heldout_every and (step + 1) % heldout_every == 0 and heldout_curve is not None:
            with torch.no_grad():
                heldout_curve.append((step + 1, heldout_accuracy(policy, tok, workload, seed, math_ops=math_ops)))
            print(f"[sft] step {step + 1}: held-out accuracy {heldout_curve[-1][1]:.3f}", flush=True)
    return losses


def draft_token_counts(spec: DraftSpec, tok, workload: str, seed: int, vocab_size: int,
                       math_ops: tuple[int, int] = MATH_OPS) -> torch.Tensor | None:
    """How often each token is written in 512 of the workload's demonstrations: the counts an EAGLE-3 draft with
    ``options.draft_vocab_size`` keeps its vocabulary from (SpecForge's rule); None for other drafts."""
    if spec.family != "eagle3" or not spec.options.get("draft_vocab_size"):
        return None
    ids, _, mask = demo_batch(tok, _items(workload, seed, 512, draw=19_999, math_ops=math_ops), "cpu")
    return torch.bincount(ids[mask.bool()], minlength=vocab_size)


def draft_seed(seed: int, family: str) -> int:
    """The seed of one draft's warm start: the run's seed and the family's name (a stable hash, not Python's)."""
    return (seed * 1_000_003 + zlib.crc32(family.encode())) % 2**63


def warm_start_drafts(policy, tok, workload: str, specs: list[DraftSpec], spec: SFTSpec, seed: int,
                      math_ops: tuple[int, int] = MATH_OPS,
                      autocast_dtype: torch.dtype | None = None) -> dict[str, list[float]]:
    """Train each draft on the frozen SFT policy's taps and logits (one policy forward per batch; the forwards and
    the drafts' losses under ``autocast_dtype`` autocast when given).

    Each draft draws its initial weights and its anchors from its own seed (``draft_seed``), so a draft's warm start
    is the same whichever other drafts train beside it and in whatever order they are named."""
    drafts, opts, gens = {}, {}, {}
    for ds in specs:
        own = draft_seed(seed, ds.family)
        torch.manual_seed(own)
        d = build_draft(ds, policy, mask_token_id=tok.mask_id, train=True,
                        token_counts=draft_token_counts(ds, tok, workload, seed, policy.vocab_size, math_ops))
        drafts[ds.family] = d
        opts[ds.family] = torch.optim.AdamW(trainable_parameters(d), lr=ds.lr, weight_decay=0.0)
        gens[ds.family] = torch.Generator().manual_seed(own)
    # one recorder covering every draft's taps: the union of their layers
    layers = sorted({l for d in drafts.values() for l in d.tap_spec.as_output_layers()})
    from repro.models.taps import TapSpec
    policy.set_taps(TapSpec(tuple(layers), "output", policy.num_layers))
    losses: dict[str, list[float]] = {f: [] for f in drafts}
    bar = Progress(spec.draft_steps, f"[sft {workload}] drafts {','.join(drafts)}")
    for step in range(spec.draft_steps):
        ids, att, mask = demo_batch(tok, _items(workload, seed, spec.batch, draw=20_000 + step, math_ops=math_ops),
                                    policy.device)
        with torch.no_grad(), autocast_or_off(policy.device.type, autocast_dtype):
            out = policy.forward_train(ids, want_taps=True, attention_mask=att)
        feats = TargetFeatures(dict(zip(layers, out.taps)))
        for fam, d in drafts.items():
            batch = DraftBatch(input_ids=ids, loss_mask=draft_loss_mask(mask), policy_logits=out.logits.detach(),
                               extras={"anchor_generator": gens[fam]})
            with autocast_or_off(policy.device.type, autocast_dtype):
                loss = d.draft_loss(feats, batch)
            opts[fam].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable_parameters(d), 1.0)
            opts[fam].step()
            losses[fam].append(float(loss.detach()))
        bar.update(info=", ".join(f"{f} {l[-1]:.3f}" for f, l in losses.items()))
        if step % 50 == 0:
            print(f"[sft] draft step {step}: " + ", ".join(f"{f} {l[-1]:.3f}" for f, l in losses.items()), flush=True)
    return drafts, losses


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """Inside: torch's deterministic kernels (``torch.use_deterministic_algorithms(True)``, an error for an operation
    without one); the previous setting after. Off: nothing changes."""
    if not enabled:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _save_atomic(obj, path: Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_atomic(path, buf.getvalue())


def build_warm_start(out: str | Path, policy_spec: PolicySpec, workload: str, sft: SFTSpec,
                     drafts: list[DraftSpec], *, vocab_size: int, seed: int = 0, device: str = "cpu",
                     heldout_every: int = 0, math_ops: tuple[int, int] = MATH_OPS,
                     autocast_dtype: torch.dtype | None = None) -> dict:
    if workload not in WORKLOADS:
        raise ConfigError(f"config workload={workload!r} is invalid: expected one of {WORKLOADS}")
    policy_spec.validate()
    sft.validate()
    for d in drafts:
        d.validate()
    out = Path(out)
    if sft.deterministic:   # cuBLAS reads it when its first handle is made; deterministic mode checks it is set
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    t0 = time.perf_counter()
    tok = build_workload_tokenizer(out / "tokenizer", vocab_size, seed)
    torch.manual_seed(seed)
    policy = make_policy(policy_spec, tok.vocab_size, seed=seed, dtype=torch.float32, device=device)
    curve: list[tuple[int, float]] = []
    losses = sft_policy(policy, tok, workload, sft, seed, heldout_every=heldout_every, heldout_curve=curve,
                        math_ops=math_ops, autocast_dtype=autocast_dtype)
    t_sft = time.perf_counter() - t0
    acc = heldout_accuracy(policy, tok, workload, seed, math_ops=math_ops)
    print(f"[sft] held-out greedy accuracy {acc:.3f}", flush=True)
    policy.requires_grad_(False)
    with deterministic_algorithms(sft.deterministic):
        models, dlosses = (warm_start_drafts(policy, tok, sft.draft_workload or workload, drafts, sft, seed,
                                             math_ops, autocast_dtype=autocast_dtype) if drafts else ({}, {}))
    for ds in drafts:
        _save_atomic({"family": ds.family, "options": dict(ds.options),
                      "state_dict": models[ds.family].state_dict()}, draft_file(out, ds.family))
    # policy.pt last: the workflow's marker that the warm start is complete
    _save_atomic({"family": policy_spec.family, "scale": policy_spec.scale, "overrides": dict(policy_spec.overrides),
                  "vocab_size": tok.vocab_size, "state_dict": policy.model.state_dict()}, out / "policy.pt")
    summary = {"workload": workload, "math_ops": list(math_ops), "policy": vars(policy_spec), "sft": vars(sft),
               "autocast_dtype": str(autocast_dtype).removeprefix("torch.") if autocast_dtype is not None else None,
               "seed": seed, "sft_loss_first": losses[0], "sft_loss_last": losses[-1], "sft_losses": losses,
               "heldout_accuracy": acc,
               "drafts": {f: {"loss_first": l[0], "loss_last": l[-1], "losses": l} for f, l in dlosses.items()},
               "sft_time_s": t_sft, "total_time_s": time.perf_counter() - t0, "provenance": provenance()}
    if heldout_every:
        summary["heldout_curve"] = curve
    write_json_atomic(out / "sft.json", summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    from repro.core.profile import ProfileError
    from repro.rl.config import load_run_profile
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--policy", required=True, help="a key of the profile's rl.policies")
    ap.add_argument("--workload", required=True, choices=WORKLOADS)
    ap.add_argument("--drafts", default="", help="comma-separated keys of rl.drafts to warm-start")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--heldout-every", type=int, default=0,
                    help="also score the held-out split every N SFT steps (sft.json's heldout_curve; "
                         "0: only at the end)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.heldout_every < 0:
            raise ConfigError(f"--heldout-every {args.heldout_every} is invalid: expected an integer >= 0")
        prof = load_run_profile(args.profile)
        rl = prof.get("rl") or {}
        if args.policy not in rl.get("policies", {}):
            raise ConfigError(f"--policy {args.policy!r} is invalid: expected one of {sorted(rl.get('policies', {}))}")
        names = [d for d in args.drafts.split(",") if d]
        bad = [d for d in names if d not in rl.get("drafts", {})]
        if bad:
            raise ConfigError(f"--drafts {bad} are invalid: expected keys of rl.drafts {sorted(rl.get('drafts', {}))}")
        drafts = [DraftSpec(**rl["drafts"][d]) for d in names]
        device = "cuda" if prof["hardware"]["device"] == "cuda" else "cpu"
        require_device(device, prof["name"])
        build_warm_start(args.out, PolicySpec(**rl["policies"][args.policy]), args.workload,
                         sft_spec(rl, args.workload), drafts, vocab_size=int(rl.get("vocab_size", 512)),
                         seed=args.seed, device=device, heldout_every=args.heldout_every,
                         math_ops=tuple((rl.get("workload") or {}).get("math_ops", MATH_OPS)),
                         autocast_dtype=update_autocast_dtype(str(prof.get("dtype", "float32")), device))
    except (ConfigError, ProfileError, FileNotFoundError) as exc:
        print(f"sft: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
