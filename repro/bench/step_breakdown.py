"""Where a co-training step's time goes, without a profiler in the way: synchronised timers per phase.

``repro.bench.profile_step`` runs a whole step under ``torch.profiler``, which slows a launch-bound
step several-fold. This tool times the pieces directly (``torch.cuda.synchronize`` around each, so the
pieces add up to a little more than an unsynchronised step) for each table1 row of a profile
(random-initialised models: the cost of a step depends on shapes and verify steps, not on what the
weights know):

* rollout: wall time, policy forwards (verify steps), time per forward; then, over one more rollout
  with the engine's phases wrapped in synchronised timers: policy forward, draft proposal, draft
  observation, verification, the rest;
* update, one microbatch of the rollout batch: the policy's forward + backward alone, the draft's
  loss forward + backward alone (on the detached taps), anchor sampling alone (each timed by
  ``repro.bench.common.time_samples``: CUDA events from an idle device on a GPU); then the draft's
  microbatch once under ``torch.profiler`` for its operator and kernel counts (``draft_ops``), the
  number that decides a launch-bound draft's cost;
* the whole update (``JointUpdate.step``) as the trainer runs it; for a drafted row also interleaved with a
  no-draft update of the same policy in the same process (round k: the no-draft update, then the drafted
  one, then with ``draft.cuda_graph`` the drafted one with its training step eager), which gives the update
  overhead without the process-to-process speed differences that a comparison of two rows' runs carries.

Writes ``<out>/step_breakdown.json`` (per row: the timings, raw samples, counts, top operators, plus
provenance) and prints a summary.

    python -m repro.bench.step_breakdown --profile h200 --out $OUT/breakdown          # one GPU, ~3 min
    python -m repro.bench.step_breakdown --profile cpu-tiny --rows "Qwen3-8B/DFlash"  # CPU check
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import repro.rollout.engine as engine_mod
from repro.bench.common import summarize, time_samples
from repro.bench.profile_step import table1_rows
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.report.profiles import load_profile
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import run_config_from_profile
from repro.rl.grpo import group_advantages
from repro.rl.joint import draft_loss_mask
from repro.rl.summary import paired_overhead_pct, run_dir_name
from repro.rl.tokenizer import build_workload_tokenizer
from repro.rl.trainer import CoTrainer
from repro.rl.update_ab import interleaved_update_ab


class PhaseTimer:
    """Accumulates synchronised wall time per label; ``wrap(obj, name, label)`` times every call."""

    def __init__(self, device: str):
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.total: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self._undo: list = []

    @contextlib.contextmanager
    def span(self, label: str):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.total[label] += time.perf_counter() - t0
            self.calls[label] += 1

    def wrap(self, obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **kw):
            with self.span(label):
                return fn(*a, **kw)
        setattr(obj, name, timed)
        self._undo.append((obj, name, fn))

    def unwrap(self) -> None:
        for obj, name, fn in reversed(self._undo):
            setattr(obj, name, fn)
        self._undo.clear()


def _top_ops(prof, top: int = 20) -> dict:
    """Operator and kernel counts of a profiled call, and where its time went: the most frequent
    top-level operators, the kernels with the most device time, the summed device (kernel busy) time
    and the host time of the top-level operators (the two numbers that say host- or device-bound)."""
    ops, kern_time, kern_count = collections.Counter(), collections.Counter(), collections.Counter()
    host_us = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            kern_time[e.name] += getattr(e, "device_time", getattr(e, "cuda_time", 0.0))
            kern_count[e.name] += 1
            continue
        par = e.cpu_parent
        if e.name.startswith("aten::") and not (par is not None and par.name.startswith("aten::")):
            ops[e.name] += 1
            host_us += e.cpu_time_total
    return {"top_level_ops": sum(ops.values()), "device_kernels": sum(kern_count.values()),
            "kernel_busy_ms": sum(kern_time.values()) / 1e3, "top_level_host_ms": host_us / 1e3,
            "top": [{"name": n, "count": c} for n, c in ops.most_common(top)],
            "top_kernels": [{"name": n[:160], "count": kern_count[n], "device_ms": t / 1e3}
                            for n, t in kern_time.most_common(top)]}


def breakdown_row(prof_cfg: dict, row: str, out: Path, warmup: int, repeats: int, device: str) -> dict:
    cfg = run_config_from_profile(prof_cfg, "table1", row, out=str(out / "runs" / run_dir_name(row)))
    tok = build_workload_tokenizer(out / "tokenizer", cfg.vocab_size, 0)
    tr = CoTrainer(cfg, tok)
    for s in range(warmup):
        tr.train_step(s)
    timer = PhaseTimer(device)
    res: dict = {"row": row}

    # -- rollout: plain, then with the phases timed ------------------------------------------------------
    batch = tr.rollout(warmup)
    res["rollout"] = {"time_s": batch.rollout_time_s, "policy_forwards": batch.policy_forwards,
                      "gen_tokens": batch.gen_tokens,
                      "ms_per_forward": 1e3 * batch.rollout_time_s / max(1, batch.policy_forwards)}
    eng = tr.engine
    timer.wrap(eng.policy, "decode_step", "policy_forward")
    if eng.proposer is not None:
        timer.wrap(eng.proposer, "propose", "draft_propose")
        timer.wrap(eng.proposer, "observe", "draft_observe")
    timer.wrap(engine_mod, "verify", "verify")
    timer.wrap(eng, "_commit", "commit")
    with timer.span("rollout_total"):
        tr.rollout(warmup + 1)
    timer.unwrap()
    tot = timer.total.pop("rollout_total")
    timer.calls.pop("rollout_total")
    res["rollout_phases_s"] = dict(timer.total)
    res["rollout_phases_s"]["rest"] = tot - sum(timer.total.values())
    res["rollout_phase_calls"] = dict(timer.calls)
    res["rollout_synced_s"] = tot

    # -- update pieces on one microbatch -----------------------------------------------------------------
    upd, dev = tr.update, tr.policy.device
    mb = min(cfg.grpo.microbatch, batch.size)
    ids, att = batch.input_ids[:mb].to(dev), batch.attention_mask[:mb].to(dev)
    mask = batch.loss_mask[:mb].to(dev)
    amp = (torch.autocast(dev.type, dtype=upd.autocast_dtype) if upd.autocast_dtype is not None
           else contextlib.nullcontext())
    want_taps = tr.draft is not None

    def policy_fb():
        with amp:
            o = tr.policy.forward_train(ids, want_taps=want_taps, attention_mask=att)
            loss = o.logits.float().logsumexp(-1).mean()
        loss.backward()
        tr.policy.model.zero_grad(set_to_none=True)
    sync = timer.sync
    piece = lambda fn: summarize(time_samples(fn, warmup=0, repeats=repeats, device=dev))
    res["update_microbatch"] = {"rows": mb, "seq_len": int(ids.shape[1]), "policy_fwd_bwd_s": piece(policy_fb)}
    if tr.draft is not None:
        with torch.no_grad(), amp:
            o = tr.policy.forward_train(ids, want_taps=True, attention_mask=att)
        feats = TargetFeatures(dict(zip(tr.policy.tap_spec.as_output_layers(), o.taps)))
        gen = torch.Generator().manual_seed(0)
        dbatch = DraftBatch(input_ids=ids, loss_mask=draft_loss_mask(mask), policy_logits=o.logits.detach(),
                            extras={"anchor_generator": gen})

        def draft_fb():
            with amp:
                dl = tr.draft.draft_loss(feats, dbatch)
            dl.backward()
            tr.draft.zero_grad(set_to_none=True)
        res["update_microbatch"]["draft_fwd_bwd_s"] = piece(draft_fb)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=acts) as p:
            draft_fb()
            sync()
        res["draft_ops"] = _top_ops(p)
        with profile(activities=acts) as p:
            policy_fb()
            sync()
        res["policy_ops"] = _top_ops(p)
        sampler = getattr(tr.draft, "cfg", None)
        if sampler is not None and hasattr(sampler, "num_anchors"):
            from repro.models.block_draft import sample_anchors
            lm = draft_loss_mask(mask)
            res["update_microbatch"]["sample_anchors_s"] = piece(lambda: sample_anchors(lm, sampler.num_anchors, gen))

    # -- the whole update as the trainer runs it -----------------------------------------------------------
    adv = group_advantages(batch.rewards, cfg.grpo.generations_per_prompt, cfg.grpo.normalize_std)
    st = [upd.step(batch, adv, anchor_seed=s, temperature=cfg.grpo.temperature) for s in range(repeats)]
    res["update"] = {"time_s": summarize([s.update_time_s for s in st]),
                     "draft_time_s": summarize([s.draft_time_s for s in st])}
    if tr.draft is not None:
        res["update_ab"] = update_overhead_ab(tr, batch, adv, cfg, repeats)
    return res


def update_overhead_ab(tr: CoTrainer, batch, adv, cfg, repeats: int) -> dict:
    """The drafted update against a no-draft update of the same policy, interleaved in one process
    (``repro.rl.update_ab``); with a graphed draft training step (``draft.cuda_graph``) each round also runs
    the drafted update with that step eager (``drafted_eager_s``, ``overhead_eager_pct``).
    ``overhead_pct`` is from the median per-round ratio (session 5's committed files: from the medians,
    now ``overhead_of_medians_pct``)."""
    graphed = tr.update.draft_step
    variants = {}
    if graphed is not None:
        def drafted_eager(k):
            tr.update.draft_step = None
            try:
                return tr.update.step(batch, adv, anchor_seed=k, temperature=cfg.grpo.temperature).update_time_s
            finally:
                tr.update.draft_step = graphed
        variants["drafted_eager"] = drafted_eager
    res = interleaved_update_ab(tr, batch, adv, repeats, variants=variants)
    if graphed is not None:
        res.update(overhead_eager_pct=paired_overhead_pct(res["samples"]["no_draft"], res["samples"]["drafted_eager"]),
                   draft_graph=graphed.status())
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200", help="profile whose table1 rows are measured (default h200)")
    ap.add_argument("--rows", default="", help="comma-separated table1 rows (default: every row of the first policy)")
    ap.add_argument("--out", type=Path, default=Path("step_breakdown_out"))
    ap.add_argument("--warmup", type=int, default=2, help="training steps before measuring (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="samples per timed piece (default 5)")
    args = ap.parse_args(argv)
    prof_cfg = load_profile(args.profile)
    wanted = table1_rows(prof_cfg, args.profile, args.rows)
    device = "cuda" if prof_cfg["hardware"]["device"] == "cuda" else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"profile": args.profile, "warmup": args.warmup, "repeats": args.repeats, "rows": {}, "errors": {}}
    for row in wanted:
        try:
            r = breakdown_row(prof_cfg, row, args.out, args.warmup, args.repeats, device)
        except Exception as exc:  # noqa: BLE001 -- one failing row keeps the others
            import traceback
            traceback.print_exc()
            report["errors"][row] = f"{type(exc).__name__}: {exc}"
            continue
        report["rows"][row] = r
        ro, um = r["rollout"], r["update_microbatch"]
        print(f"[{row}] rollout {ro['time_s']:.3f}s / {ro['policy_forwards']} forwards = "
              f"{ro['ms_per_forward']:.1f} ms; phases " +
              ", ".join(f"{k} {v:.3f}s" for k, v in r["rollout_phases_s"].items()), flush=True)
        print(f"    update {r['update']['time_s']['median']:.3f}s; microbatch of {um['rows']}: policy fwd+bwd "
              f"{um['policy_fwd_bwd_s']['median'] * 1e3:.1f} ms" +
              (f", draft fwd+bwd {um['draft_fwd_bwd_s']['median'] * 1e3:.1f} ms "
               f"({r['draft_ops']['top_level_ops']} ops, {r['draft_ops']['device_kernels']} kernels; policy "
               f"{r['policy_ops']['top_level_ops']} ops, {r['policy_ops']['device_kernels']} kernels; kernel busy "
               f"draft {r['draft_ops']['kernel_busy_ms']:.1f} ms, policy {r['policy_ops']['kernel_busy_ms']:.1f} ms)"
               if "draft_fwd_bwd_s" in um else ""), flush=True)
        if "update_ab" in r:
            ab = r["update_ab"]
            print(f"    update interleaved with a no-draft update ({ab['rounds']} rounds): "
                  f"{ab['drafted_s']['median']:.3f}s vs {ab['no_draft_s']['median']:.3f}s, overhead "
                  f"{ab['overhead_pct']:.1f}%" + (f"; draft step eager {ab['drafted_eager_s']['median']:.3f}s, "
                                                  f"overhead {ab['overhead_eager_pct']:.1f}%; graph {ab['draft_graph']}"
                                                  if "drafted_eager_s" in ab else ""), flush=True)
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
        write_json_atomic(args.out / "step_breakdown.json", {**report, "provenance": provenance()})
    write_json_atomic(args.out / "step_breakdown.json", {**report, "provenance": provenance()})
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
