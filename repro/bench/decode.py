"""Decode benchmark: our engine with and without each draft family beside the peers a user would pick and the floor.

Builds the profile's ``decode:`` policy, pre-trains it briefly on a synthetic Markov language
(``repro.models.synthetic``: a random-init policy gives drafts nothing to learn), trains an EAGLE-3, a DFlash and a
DSpark draft on its samples, then measures in one run on the same weights and fresh prompts (temperature 1):
``suite-<mode>/<family>/b<B>`` our engine per ``engine_modes`` (raw samples, ms per step, tokens/s, acceptance
length, speedup and speedup / AL, also from process CPU time: ``*_cpu``, and occupancy: the share of (row, step)
slots whose row was still generating, about what speedup / AL reaches with a free draft at B > 1, since the batch
steps until its slowest row is done, and ``first_call_s``: the warm-up call, a new engine's compilations and graph
captures included); ``bound/<family>/b<B>`` the policy's verify step over its decode step, static or, on a GPU
with a compiled mode in the run, with the compiled layers (params ``step``; speedup / AL cannot pass its inverse);
``peer/<peer>/b<B>`` transformers' StaticCache + compile, its eager DynamicCache and vLLM where importable
(``repro.rollout.peers``; a peer that cannot run is listed with its reason in ``peer_status``); ``floor/b<B>`` the
weights read once at envcheck's copy bandwidth (``--envcheck``); ``identity/<family>/<mode>`` greedy speculative
output against plain greedy output.

On CUDA the engine self-check (``repro.rollout.self_check``) runs first and writes ``self_check.json``
(``--self-check-only`` stops there; a failure exits non-zero). Writes ``bench.json``, ``metrics.jsonl`` and
``env.json`` through ``repro.core.timing.BenchRun``; CPU runs are labelled cpu-emulated. A run cut off (killed, out of
time) continues where it stopped when started again with the same settings at the same commit: the trained models,
the self-check's verdict and their rows from ``decode_state.pt``, the measured points from BenchRun's journal.

    python -m repro.bench.decode --profile cpu-tiny --out /tmp/dec --envcheck results/<tag>/cpu-tiny/envcheck/bench.json
    python -m repro.bench.decode --profile h200 --self-check-only --out /tmp/dec    # the GPU check alone
    python -m repro.bench.decode --profile my.yaml --batch-sizes 1,4 --train-steps 20 --out /tmp/dec   # quick
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from pydantic import ValidationError

from repro.core.io import write_atomic_with, write_json_atomic
from repro.core.profile import (
    Decode,
    ProfileError,
    describe_error,
    load_profile,
    load_profile_model,
)
from repro.core.timing import BenchRun, summarize, time_samples
from repro.decoding.cuda_graph import GraphedCallable
from repro.decoding.merged_projections import merged_projections
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.synthetic import MarkovLanguage, pretrain_policy
from repro.models.train_draft import train_draft
from repro.rollout.compiled_layers import compiled_layers
from repro.rollout.engine import COMPILED_MODES, CUDA_GRAPH_MODES, POLICY_COMPILED_MODES, RolloutEngine
from repro.rollout.peers import PEERS, PeerUnavailable, make_peer
from repro.rollout.samples import sample_sequences
from repro.rollout.self_check import run_self_check, verdict_table

FAMILIES = ("eagle3", "dflash", "dspark")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def decode_settings(section: Decode | dict | None, profile: str, overrides: dict | None = None) -> Decode:
    """A profile's ``decode:`` section (typed by repro.core.profile.Decode), with the command line's overrides
    (None = keep) validated alike; ProfileError naming the key otherwise."""
    if section is None:
        raise ProfileError(f"profile {profile!r} has no decode: section (the decode benchmark's workload: "
                           f"{', '.join(Decode.model_fields)})")
    vals = section.model_dump() if isinstance(section, Decode) else dict(section)
    vals.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Decode.model_validate(vals)
    except ValidationError as exc:
        raise ProfileError(f"profile {profile!r}: " + "; ".join(describe_error({**e, "loc": ("decode", *e["loc"])})
                                                               for e in exc.errors())) from None


def copy_bandwidth_gbps(path: str | Path) -> float:
    """envcheck's measured copy bandwidth (GB/s, read + write counted) from its env.json, bench.json or folder."""
    p = Path(path)
    cands = [p / "env.json", p / "bench.json"] if p.is_dir() else [p]
    for c in (c for c in cands if c.is_file()):
        data = json.loads(c.read_text())
        bw = (data.get("ceilings") or {}).get("copy_bw_gbps") or next(
            (r["metrics"].get("copy_bw_gbps") for r in data.get("records", []) if r.get("row") == "copy"), None)
        if bw:
            return float(bw)
    raise ValueError(f"--envcheck {str(p)!r}: no copy_bw_gbps found (expected envcheck's env.json with "
                     "'ceilings', its bench.json with a 'copy' row, or their folder)")


# -- workload ---------------------------------------------------------------------------------------------------
def make_draft(family: str, policy, s: Decode):
    """A fresh draft of ``family`` sized from the policy (fp32 master weights by default: AdamW on bf16
    parameters loses small updates); it reads the policy's taps and rides the policy's head."""
    torch.manual_seed(0)
    ddtype = DTYPES[s.draft_dtype]
    if family == "eagle3":
        d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=s.eagle_k)).to(device=policy.device, dtype=ddtype)
        d.init_from_policy(policy)
        return d
    cfg = BlockDraftConfig.from_policy(policy, num_layers=s.block_layers, block_size=s.block_size)
    cls = DFlashDraft if family == "dflash" else DSparkDraft
    return cls(cfg, policy).to(device=policy.device, dtype=ddtype)


def proposer_for(family: str, draft, s: Decode):
    return Eagle3Proposer(draft, s.eagle_k) if family == "eagle3" else BlockProposer(draft)


def loss_ends(losses: list[float]) -> dict[str, float]:
    """Mean of the first and of the last tenth of a loss curve."""
    k = max(1, len(losses) // 10)
    return {"loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k}


def pretrain_recorded(bench: BenchRun, policy, lang: MarkovLanguage, s) -> None:
    """Pre-train ``policy`` on ``lang`` (settings ``s``: attributes or a dict) and record the ``pretrain`` row."""
    get = (lambda k: s[k]) if isinstance(s, dict) else (lambda k: getattr(s, k))
    t0 = time.perf_counter()
    losses = pretrain_policy(policy, lang, steps=get("pretrain_steps"), batch_size=get("pretrain_batch"),
                             seq_len=get("pretrain_len"), lr=get("pretrain_lr"))
    bench.record("pretrain", {"steps": len(losses)},
                 extra={"pretrain_time_s": time.perf_counter() - t0, **loss_ends(losses),
                        "language_entropy": lang.entropy()})


def identity_check(policy, drafts: dict, s: Decode, prompts, mode: str) -> dict[str, float]:
    """Fraction of rows whose greedy speculative output (engine ``mode``) equals plain greedy output, in fp32."""
    import copy
    pol32 = policy.copy_as(torch.float32) if policy.dtype != torch.float32 else policy
    plain = RolloutEngine(pol32).generate(prompts, max_new_tokens=s.new_tokens // 2, greedy=True)
    out = {}
    for fam, d in drafts.items():
        d32 = copy.deepcopy(d).float() if policy.dtype != torch.float32 else d
        if hasattr(d32, "attach"):
            d32.attach(pol32)
        pol32.set_taps(d32.tap_spec)
        spec = RolloutEngine(pol32, proposer_for(fam, d32, s), cuda_graphs=mode).generate(
            prompts, max_new_tokens=s.new_tokens // 2, greedy=True)
        out[fam] = sum(a == b for a, b in zip(spec.tokens, plain.tokens)) / len(prompts)
    return out


class Timer:
    """Wall and process-CPU seconds per call of a decode function (one warm-up call first, whose wall seconds, the
    compilations and graph captures of a new engine included, are kept in ``first_call_s``). ``outside_cpu``: a
    clock of the CPU seconds the function spends in other processes (a peer in its own interpreter), counted too."""

    def __init__(self, device: torch.device, repeats: int):
        self.device, self.repeats = device, repeats
        self.first_call_s = 0.0

    def __call__(self, fn, outside_cpu=lambda: 0.0):
        result, cpu, wall = {}, [], []

        def go():
            t0, c0 = time.perf_counter(), time.process_time() + outside_cpu()
            result["r"] = fn()            # token lists on the host: the call has finished on the device
            cpu.append(time.process_time() + outside_cpu() - c0)
            wall.append(time.perf_counter() - t0)

        samples = time_samples(go, warmup=1, repeats=self.repeats, device=self.device)
        self.first_call_s = wall[0]
        return samples, summarize(cpu[1:])["median"], result["r"]


def bound_step(policy, modes) -> str | None:
    """The compile backend of the policy step the bound rows time: on a GPU the compiled layers where the run has a
    mode that compiles the policy (its fastest policy step), else None (the static step; a CPU's compiled mode is the
    fused one, whose step is traced whole, not layer by layer)."""
    return "inductor" if policy.device.type == "cuda" and set(modes) & set(POLICY_COMPILED_MODES) else None


def policy_step_ratio(policy, batch: int, k: int, prompt_len: int, repeats: int,
                      compile_backend: str | None = None) -> tuple[float, float, float]:
    """The policy's verify step over k+1 tokens against its one-token step after one prompt, graphed on a GPU as the
    engine runs them (with ``compile_backend``, the decoder layers compiled as in the engine's compiled mode): (ratio
    of medians, verify s, decode s). Timed alternately, so a load change hits both."""
    cache = policy.new_static_cache(batch, 256)
    dev = policy.device
    ids = torch.randint(0, policy.vocab_size - 1, (batch, prompt_len), device=dev)
    cache.start()
    policy.decode_step_static(ids, torch.arange(prompt_len, device=dev).expand(batch, -1), cache)
    steps = {}
    for q in (1, k + 1):
        qi = torch.randint(0, policy.vocab_size - 1, (batch, q), device=dev)
        qp = prompt_len + torch.arange(q, device=dev).expand(batch, -1)
        cache.next_col = prompt_len              # the same columns every call: a steady-state step
        cursor = cache.reserve(q)

        def step(qi, qp, cursor, view):
            with compiled_layers(policy, compile_backend):
                return policy.decode_step_static(qi, qp, cache, cursor=cursor, view=view).logits
        graph = GraphedCallable(step, f"bound.step[{q}]", enabled=dev.type == "cuda")
        steps[q] = functools.partial(graph, qi, qp, cursor, view=cache.used_view())
    times = {q: [] for q in steps}
    with merged_projections(policy.model):           # as the engine's steps run
        for _ in range(max(10, 4 * repeats)):
            for q, step in steps.items():
                times[q] += time_samples(step, warmup=1, repeats=1, device=dev)
    verify, decode = (summarize(times[q])["median"] for q in (k + 1, 1))
    return verify / decode, verify, decode


# -- the run ----------------------------------------------------------------------------------------------------
def run(profile_ref: str, out: Path, overrides: dict | None = None, *, envcheck: str | None = None,
        deadline_s: float | None = None, self_check_only: bool = False) -> list[dict]:
    """Run the benchmark into ``out``. With ``deadline_s`` (seconds from now), points not yet started when it
    passes are skipped (listed in the run's config) so the run still ends cleanly with its bench.json."""
    t_start = time.monotonic()
    model = load_profile_model(profile_ref)
    profile = load_profile(profile_ref)
    s = decode_settings(model.decode, model.name, overrides)
    deadline_s = s.deadline_s if deadline_s is None else deadline_s
    bw = copy_bandwidth_gbps(envcheck) if envcheck else None     # a bad --envcheck fails before any work
    want_cuda = profile["hardware"]["device"] == "cuda"
    if want_cuda and not torch.cuda.is_available():
        raise SystemExit(f"profile {profile['name']!r} needs a CUDA GPU and this machine has none")
    if s.threads:
        torch.set_num_threads(s.threads)
    device = torch.device("cuda" if want_cuda else "cpu")
    dtype = DTYPES[profile["dtype"]] if want_cuda else torch.float32
    config = {"profile": profile["name"], "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              "threads": torch.get_num_threads(), **{k: (list(v) if isinstance(v, tuple) else v)
                                                     for k, v in s.model_dump().items()}}
    policy = build_policy("qwen3", s.scale, seed=0, dtype=dtype, device=device, vocab_size=s.vocab_size,
                          **s.policy_overrides)
    config["policy_parameters"] = policy.num_parameters()
    weight_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    config["policy_weight_bytes"] = weight_bytes
    lang = MarkovLanguage(policy.vocab_size - 1, s.lang_tokens, seed=0)
    train_prompts = lang.sample(s.train_prompts, s.prompt_len, seed=1).tolist()
    eval_prompts = lang.sample(max(s.batch_sizes), s.prompt_len, seed=2).tolist()
    skipped: list[str] = []
    peer_status: dict[str, str] = {}
    config["skipped_for_deadline"] = skipped      # shared with BenchRun's (shallow) copy of the config
    config["peer_status"] = peer_status
    config["floor"] = (f"weights read once at envcheck's copy bandwidth {bw:.1f} GB/s ({envcheck})" if bw else
                       "skipped: no --envcheck given (the floor needs envcheck's measured copy bandwidth)")
    if not bw:
        print("decode: no --envcheck given, so no floor row (it needs envcheck's copy bandwidth)", flush=True)

    def skip(point: str) -> bool:
        """Whether ``point`` starts past the deadline (then it is listed in ``skipped``)."""
        if deadline_s is None or time.monotonic() - t_start <= deadline_s:
            return False
        skipped.append(point)
        return True

    with BenchRun(out, artifact="decode", profile=profile["name"], config=config,
                  resume=not self_check_only) as bench:
        state = RunState(out / STATE, bench, policy, s, dtype)
        drafts = state.restore()
        if drafts is None:
            drafts = prepare_models(bench, policy, lang, s, train_prompts, dtype)
            state.save(drafts)
        if (device.type == "cuda" or self_check_only) and not state.checked:
            failed = self_check(bench, policy, drafts, s, eval_prompts, lang, out, timed=self_check_only)
            if self_check_only:
                return bench.records
            state.save(drafts, after_check=True, check_failed=failed)
        for mode in ([] if device.type == "cuda" else s.engine_modes):    # on CUDA the self-check did this
            for fam, frac in identity_check(policy, drafts, s, eval_prompts[:4], mode).items():
                bench.record(f"identity/{fam}/{mode}", {"family": fam, "mode": mode, "rows": 4},
                             extra={"greedy_identical_frac": frac})
        timer = Timer(device, s.repeats)
        for B in s.batch_sizes:
            if skip(f"b{B}"):
                continue
            sweep_batch(bench, timer, policy, drafts, s, eval_prompts[:B], B, skip)
            peers_batch(bench, timer, policy, s, eval_prompts[:B], B, peer_status, out, skip)
            if bw:
                floor_s = weight_bytes / (bw * 1e9)
                bench.record(f"floor/b{B}", {"batch": B, "copy_bw_gbps": bw, "weight_bytes": weight_bytes},
                             extra={"ms_per_step": floor_s * 1e3, "tokens_per_s": B / floor_s})
        for fam in s.families:                 # acceptance under greedy decoding, batch 8: acceptance only
            if skip(f"{fam}/greedy"):
                continue
            policy.set_taps(drafts[fam].tap_spec)
            r = RolloutEngine(policy, proposer_for(fam, drafts[fam], s)).generate(
                eval_prompts[:8], max_new_tokens=s.new_tokens, greedy=True)
            bench.record(f"{fam}/greedy", {"family": fam, "batch": 8, "greedy": True},
                         extra={"acceptance_length": r.counters.acceptance_length})
    state.remove()
    if state.check_failed:
        raise SystemExit(f"decode: the engine self-check failed: {state.check_failed}")
    return bench.records


def prepare_models(bench, policy, lang, s: Decode, train_prompts, dtype) -> dict:
    """Pre-train ``policy`` on ``lang`` and train each family's draft on its samples, recording each phase's row;
    the drafts, in the policy's dtype."""
    pretrain_recorded(bench, policy, lang, s)
    t0 = time.perf_counter()
    seqs, plens = sample_sequences(policy, train_prompts, max_new_tokens=s.sample_tokens, temperature=s.temperature)
    bench.record("sample", {"prompts": len(seqs)}, extra={"sample_time_s": time.perf_counter() - t0})
    drafts = {}
    for fam in s.families:
        d = make_draft(fam, policy, s)
        t0 = time.perf_counter()
        losses = train_draft(d, policy, seqs, plens, steps=s.train_steps, lr=s.lr, batch_size=s.train_batch,
                             fallback_backend="torch")
        bench.record(f"train/{fam}", {"family": fam, "steps": len(losses), "attn_backend": d.attn_backend},
                     extra={"train_time_s": time.perf_counter() - t0, **loss_ends(losses)})
        drafts[fam] = d.eval().to(dtype)     # decoding in the policy's dtype, as the RL engine's rollout drafts
    return drafts


STATE = "decode_state.pt"


class RunState:
    """What an interrupted run keeps beside its journal (``bench.partial.jsonl``) so that the same command continues
    it: the pre-trained policy, the trained drafts, the random state after them, the rows they recorded and, once it
    ran, the self-check's verdict and rows. Valid only for the same run (BenchRun's identity: profile, settings,
    commit, machine); removed when the run ends."""

    def __init__(self, path: Path, bench: BenchRun, policy, s: Decode, dtype):
        self.path, self.bench, self.policy, self.s, self.dtype = path, bench, policy, s, dtype
        self.checked, self.check_failed = False, None

    def restore(self) -> dict | None:
        """The drafts of an earlier attempt of this run (its policy weights loaded, its rows carried), or None."""
        if self.bench.identity is None or not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location=self.policy.device, weights_only=True)
        except Exception as exc:          # noqa: BLE001 - a state cut off or unreadable: the run starts over
            print(f"decode: ignoring {self.path} ({type(exc).__name__}: {exc})", flush=True)
            return None
        if state.get("identity") != self.bench.identity:
            return None
        self.policy.model.load_state_dict(state["policy"])
        drafts = {}
        for fam in self.s.families:
            d = make_draft(fam, self.policy, self.s)
            d.load_state_dict(state["drafts"][fam])
            drafts[fam] = d.eval().to(self.dtype)
        torch.set_rng_state(state["rng"]["cpu"])
        if state["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        for rec in state["records"]:
            self.bench.carried(rec)
        self.checked, self.check_failed = state["checked"], state["check_failed"]
        print(f"decode: continuing an interrupted run from {self.path}", flush=True)
        return drafts

    def save(self, drafts: dict, *, after_check: bool = False, check_failed: str | None = None) -> None:
        """Keep the models and the rows recorded so far (``after_check``: the self-check ran, ``check_failed`` its
        verdict)."""
        if after_check:
            self.checked, self.check_failed = True, check_failed
        if self.bench.identity is None:
            return
        payload = {"identity": self.bench.identity, "policy": self.policy.model.state_dict(),
                   "drafts": {fam: d.state_dict() for fam, d in drafts.items()},
                   "rng": {"cpu": torch.get_rng_state(),
                           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                   "records": [{k: v for k, v in r.items() if k != "resumed"} for r in self.bench.records],
                   "checked": self.checked, "check_failed": self.check_failed}
        write_atomic_with(self.path, lambda f: torch.save(payload, f))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def self_check(bench, policy, drafts, s: Decode, prompts, lang, out: Path, timed: bool) -> str | None:
    """Run the engine self-check, write self_check.json, print the verdict; the failures joined, or None. Its step
    times only when ``timed`` (the check alone): a full run's sweep times every point with repeats."""
    ragged = [p[: max(2, len(p) - i % 4)] for i, p in enumerate(prompts[:4])]
    stop = int(lang.sample(1, 1, seed=9)[0, 0])
    report = run_self_check(policy, drafts, lambda fam, d: proposer_for(fam, d, s), ragged,
                            new_tokens=s.self_check_tokens, stop_token=stop, timing_prompts=prompts,
                            timing_batches=(min(s.batch_sizes), max(s.batch_sizes)) if timed else (),
                            modes=[m for m in CUDA_GRAPH_MODES if m not in COMPILED_MODES or m in s.engine_modes],
                            progress=lambda m: print(m, flush=True))
    write_json_atomic(out / "self_check.json", report)
    print(verdict_table(report), flush=True)
    for key, frac in report["identity"].items():
        bench.record(f"self_check/identity/{key}", {"check": key}, extra={"greedy_identical_frac": frac})
    for key, v in report["ms_per_step"].items():
        bench.record(f"self_check/time/{key}", {"check": key}, extra=v)
    return None if report["passed"] else "; ".join(report["failures"])


def sweep_batch(bench, timer: Timer, policy, drafts, s: Decode, prompts, B: int, skip=lambda point: False) -> None:
    """Our engine at batch ``B``: plain decoding and every family, in every engine mode (a mode for which
    ``skip(point)`` says so is not started)."""
    for mode in s.engine_modes:
        base, started = None, False
        for fam in ("plain", *s.families):
            rec = bench.restored(f"suite-{mode}/{fam}/b{B}")       # measured by an interrupted attempt of this run
            if rec is not None:
                if fam == "plain":
                    base = (rec["time_s"]["median"], rec["metrics"]["cpu_s"])
                continue
            if not started:
                if skip(f"suite-{mode}/b{B}"):
                    break
                started = True
            if fam != "plain":
                policy.set_taps(drafts[fam].tap_spec)
            eng = RolloutEngine(policy, None if fam == "plain" else proposer_for(fam, drafts[fam], s),
                                cuda_graphs="off" if fam == "plain" and mode == "draft" else mode)
            samples, cpu, r = timer(lambda eng=eng: eng.generate(prompts, max_new_tokens=s.new_tokens,
                                                                  temperature=s.temperature))
            ntok = sum(len(t) for t in r.tokens)
            med = summarize(samples)["median"]
            al = r.counters.acceptance_length
            extra = {"tokens_per_s": ntok / med, "ms_per_step": med / r.policy_forwards * 1e3, "cpu_s": cpu,
                     "acceptance_length": al, "policy_forwards": r.policy_forwards, "new_tokens": ntok,
                     "first_call_s": timer.first_call_s}
            if fam == "plain":
                base = (med, cpu)
            else:
                extra.update(speedup=base[0] / med, speedup_over_al=base[0] / med / al,
                             speedup_cpu=base[1] / cpu, speedup_cpu_over_al=base[1] / cpu / al,
                             occupancy=r.counters.verify_steps / (B * max(1, r.policy_forwards - 1)))
                for i, a in enumerate(r.counters.accepted_per_pos):
                    extra[f"accept_rate_pos{i}"] = a / max(1, r.counters.verify_steps)
            bench.record(f"suite-{mode}/{fam}/b{B}", {"engine": "suite", "mode": mode, "family": fam, "batch": B,
                                                      "new_tokens": s.new_tokens}, samples, extra=extra)
    backend = bound_step(policy, s.engine_modes)
    by_k: dict[int, tuple[float, float, float]] = {}         # families with the same chain length share the step
    for fam in s.families:
        k = proposer_for(fam, drafts[fam], s).num_proposals
        if k not in by_k:
            by_k[k] = policy_step_ratio(policy, B, k, s.prompt_len, s.repeats, backend)
        ratio, verify_s, decode_s = by_k[k]
        bench.record(f"bound/{fam}/b{B}", {"family": fam, "batch": B, "verify_tokens": k + 1,
                                           "step": "compiled" if backend else "static"},
                     extra={"verify_over_decode": ratio, "max_speedup_over_al": 1 / ratio,
                            "verify_ms": verify_s * 1e3, "decode_ms": decode_s * 1e3})


def ran_status(about: str | None) -> str:
    """A peer's ``peer_status`` once it ran: "ran", with its versions where it told them."""
    return f"ran: {about}" if about else "ran"


def peers_batch(bench, timer: Timer, policy, s: Decode, prompts, B: int, status: dict, out: Path,
                skip=lambda point: False) -> None:
    """The peers at batch ``B`` (a peer that cannot run is recorded in ``status`` with its reason; one for which
    ``skip(point)`` says so is not started)."""
    for name in s.peers:
        if status.get(name, "").startswith("unavailable"):
            continue
        earlier = bench.restored(f"peer/{name}/b{B}")     # measured by an interrupted attempt of this run
        if earlier is not None:
            status.setdefault(name, ran_status(earlier["params"].get("about")))
            continue
        if skip(f"peer/{name}/b{B}"):
            continue
        try:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="decode_peer_") as work:
                peer = make_peer(name, policy, new_tokens=s.new_tokens, temperature=s.temperature, workdir=work,
                                 max_model_len=s.prompt_len + s.new_tokens + 8)
                try:
                    setup_s = time.perf_counter() - t0
                    samples, cpu, toks = timer(lambda peer=peer: peer.generate(prompts), outside_cpu=peer.cpu_s)
                finally:
                    peer.close()
        except PeerUnavailable as exc:
            status[name] = f"unavailable: {exc}"
            print(f"decode: peer {name} unavailable: {exc}", flush=True)
            continue
        except Exception as exc:          # noqa: BLE001 - a peer's failure is recorded, the benchmark goes on
            status[f"{name}/b{B}"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            print(f"decode: peer {name} failed at batch {B}: {type(exc).__name__}: {exc}", flush=True)
            continue
        status.setdefault(name, ran_status(peer.about))
        ntok = sum(len(t) for t in toks)
        med = summarize(samples)["median"]
        params = {"engine": name, "family": "plain", "batch": B, "new_tokens": s.new_tokens}
        if peer.about:        # the peer's versions, which a continued run's status takes from the journal
            params["about"] = peer.about
        bench.record(f"peer/{name}/b{B}", params, samples,
                     extra={"tokens_per_s": ntok / med, "ms_per_step": med / s.new_tokens * 1e3, "cpu_s": cpu,
                            "setup_s": setup_s, "new_tokens": ntok, "first_call_s": timer.first_call_s})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Decode throughput of our engine, its peers and the floor.")
    ap.add_argument("--profile", required=True, help="profile name, or a .yaml path; its decode: section is read")
    ap.add_argument("--out", type=Path, required=True, help="run folder (bench.json, metrics.jsonl, env.json)")
    ap.add_argument("--envcheck", default=None, help="envcheck's env.json, bench.json or run folder (floor row)")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (default: the profile's)")
    ap.add_argument("--pretrain-steps", type=int, default=None, help="policy pre-training steps")
    ap.add_argument("--train-steps", type=int, default=None, help="draft training steps per family")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per point")
    ap.add_argument("--families", default=None, help="comma-separated subset of eagle3,dflash,dspark")
    ap.add_argument("--modes", default=None, help=f"comma-separated engine modes, of {','.join(CUDA_GRAPH_MODES)}")
    ap.add_argument("--peers", default=None, help=f"comma-separated peers, of {','.join(PEERS)} ('none': no peer)")
    ap.add_argument("--self-check-only", action="store_true", help="train, run the engine self-check, stop")
    args = ap.parse_args(argv)

    def listed(text, allowed, flag):
        if text is None:
            return None
        vals = () if text == "none" else tuple(v for v in text.split(",") if v)
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise SystemExit(f"{flag} {bad} not in {allowed}")
        return vals

    over = {"pretrain_steps": args.pretrain_steps, "train_steps": args.train_steps, "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "families": listed(args.families, FAMILIES, "--families"),
            "engine_modes": listed(args.modes, CUDA_GRAPH_MODES, "--modes"),
            "peers": listed(args.peers, PEERS, "--peers")}
    if args.batch_sizes:
        try:
            over["batch_sizes"] = tuple(int(b) for b in args.batch_sizes.split(","))
        except ValueError:
            raise SystemExit(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}") from None
    run(args.profile, args.out, over, envcheck=args.envcheck, self_check_only=args.self_check_only)
    print(f"wrote {args.out}/bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
