"""The workflow's planner: (profile, artifact) -> the jobs that produce it. Nothing else plans.

``Plan(profile, config, machine)`` turns a typed profile (repro.core.profile) and the workflow's --config (engine,
seed, checkpoint_root, nemo_rl_dir) into jobs: what each runs, what it reads and writes, its log, its threads and
GPUs, and a digest of the settings it reads (a change reruns it). The Snakemake rules (workflow/rules/*.smk) only
match files to these jobs; the same plan serves a laptop, one GPU and a cluster. Output folders:

    results/<machine>/<label>/<artifact>/...   this machine's runs (label: the profile, or <profile>-<engine>)
    results/tidy/<label>/<artifact>.csv        collected: this machine's runs and results/reference/'s
    paper_figures/<label>/                     tables, figures, comparison reports

    python -m repro.plan --profile cpu-tiny            # every planned job and its command
    python -m repro.plan --profile h200 --artifact table1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from repro.core.handoffs import NEMO_RL_RUN
from repro.core.layout import replica_run_name, run_dir_name
from repro.core.profile import BENCH_ARTIFACTS, Profile, ProfileError, effective_specs
from repro.core.specs import ARTIFACTS as RL_ARTIFACTS
from repro.core.specs import MATH_OPS, sft_spec

PAPER_ARTIFACTS = ("table1", "table2", "fig3", "fig4", "fig5", "fig6", "fig7")
ARTIFACTS = PAPER_ARTIFACTS + ("decode",)     # what a target can name (decode: the suite's own benchmark)
ENGINES = ("suite", "nemo-rl")
TIDY = "results/tidy"
REFERENCE = "results/reference"


@dataclass(frozen=True)
class Job:
    kind: str                          # envcheck | bench | check | sft | rl | lockstep | summary | tidy | report
    artifact: str
    outputs: tuple[str, ...]
    log: str
    cmd: str
    inputs: tuple[str, ...] = ()
    threads: int = 1
    gpus: int = 0
    nodes: int = 1
    local: bool = False                # runs where snakemake runs (reports; submitting a multi-node NeMo-RL row)
    settings: str = ""                 # digest of what the job reads from the profile
    what: str = ""

    @property
    def shell(self) -> str:
        """The rule's command: progress and output on the terminal and in the log (failure kept by pipefail). ``tee
        -i`` outlives a Ctrl-C (or ``timeout``'s SIGINT) sent to the whole process group, so a training job that
        stops at its next step boundary (repro.rl.stop) still has its log and its pipe."""
        log = shlex.quote(self.log)
        return f"set -o pipefail; mkdir -p $(dirname {log}); {self.cmd} 2>&1 | tee -i {log}"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Plan:
    profile: Profile
    config: dict = field(default_factory=dict)
    machine: str = "local"
    python: str = sys.executable
    profile_arg: str = ""              # what --profile gets (the name, or the .yaml path it was loaded from)

    def __post_init__(self) -> None:
        p = self.profile
        self.profile_arg = self.profile_arg or p.name
        self.engine = self.config.get("engine") or p.engine
        if self.engine not in ENGINES:
            raise ProfileError(f"--config engine={self.engine!r} is invalid: expected one of {list(ENGINES)}")
        if self.engine == "nemo-rl" and p.nemo_rl is None:
            raise ProfileError(f"--config engine=nemo-rl is invalid for profile {p.name!r}: it has no nemo_rl: "
                               "section; expected engine=suite")
        if self.engine == "suite" and p.rl is None:
            raise ProfileError(f"--config engine=suite is invalid for profile {p.name!r}: it has no rl: section; "
                               "expected engine=nemo-rl")
        need = self.suite_checkpoints()
        if self.engine == "suite" and need and not self.config.get("checkpoint_root"):
            raise ProfileError(f"--config engine=suite on profile {p.name!r} loads the checkpoints "
                               f"{', '.join(need)} (its rl: section) but checkpoint_root is not set: add --config "
                               f"checkpoint_root=/path, the folder holding "
                               f"{', '.join(p.checkpoints[k] for k in need)}")
        self.label = p.name if self.engine == p.engine else f"{p.name}-{self.engine}"
        self.runs = f"results/{self.machine}/{self.label}"
        self.figs = f"paper_figures/{self.label}"
        self.tidy = f"{TIDY}/{self.label}"
        self.seed = int(self.config.get("seed", 0))
        self.gpu = p.hardware.device == "cuda"
        self.jobs: dict[str, Job] = {}
        self._plan()

    # -- what the profile asks for -------------------------------------------------------------------------------
    def suite_checkpoints(self) -> list[str]:
        """Keys of checkpoints: that the rl: section loads (policies and drafts with a checkpoint)."""
        rl = self.profile.rl
        if rl is None:
            return []
        keys = {e.get("checkpoint") for e in rl.policies.values()} | {d.checkpoint for d in rl.drafts.values()}
        return sorted(k for k in keys if k)

    def artifacts(self) -> list[str]:
        """The artifacts this profile plans (those with a section)."""
        return [a for a in ARTIFACTS if getattr(self.profile, a) is not None]

    def missing(self, artifact: str) -> str:
        """Why ``artifact`` is not planned here ('' when it is)."""
        if artifact in self.artifacts():
            return ""
        return (f"profile {self.profile.name} has no {artifact}: section (experiments/profiles/"
                f"{self.profile.name}.yaml); profiles that run it: see README, Profiles")

    def targets(self, artifact: str) -> list[str]:
        """Every file of an artifact: its runs, summary, collected table and report (a missing one is remade)."""
        return [o for j in self.jobs.values() if j.artifact == artifact for o in j.outputs]

    def job(self, output: str) -> Job:
        """The job writing ``output``; a clear error for a file no planned job writes."""
        for j in self.jobs.values():
            if output in j.outputs:
                return j
        raise ProfileError(f"no job of profile {self.label} on {self.machine} writes {output}; planned artifacts: "
                           f"{', '.join(self.artifacts())}")

    @property
    def envcheck(self) -> str:
        return f"{self.runs}/envcheck/bench.json"

    # -- planning ------------------------------------------------------------------------------------------------
    def _add(self, job: Job) -> None:
        for o in job.outputs:
            if o in self.jobs:
                raise ProfileError(f"two planned jobs write {o}")
            self.jobs[o] = job

    def _py(self, module: str, *args: str) -> str:
        return " ".join([shlex.quote(self.python), "-m", module, *args])

    def _plan(self) -> None:
        p, prof = self.profile, ["--profile", shlex.quote(self.profile_arg)]
        self._add(Job("envcheck", "envcheck", (self.envcheck,), f"{self.runs}/envcheck.log",
                      self._py("repro.bench.envcheck", *prof, "--out", f"{self.runs}/envcheck"),
                      gpus=int(self.gpu), settings=_digest([p.envcheck.model_dump(), p.dtype]),
                      what="the machine and its ceilings"))
        check = []
        if self.gpu and (p.fig5 is not None or p.fig6 is not None):
            out = f"{self.runs}/attention_check/attention_check.json"
            self._add(Job("check", "attention_check", (out,), f"{self.runs}/attention_check.log",
                          self._py("repro.bench.attention_check", *prof, "--out", f"{self.runs}/attention_check"),
                          gpus=1, settings=_digest(p.dtype), what="every attention path against fp64"))
            check = [out]
        for a in BENCH_ARTIFACTS:
            section = getattr(p, a)
            if section is None:
                continue
            extra = ["--envcheck", self.envcheck] if a == "decode" else []
            # processes: one per CP rank (one GPU each), or fig7's pipeline stages (sharing one GPU)
            ranks = max(section.cp) if a in ("fig5", "fig6") else section.pp if a == "fig7" else 1
            gpus = (1 if a in ("fig7", "decode") else ranks) if self.gpu else 0
            self._add(Job("bench", a, (f"{self.runs}/{a}/bench.json",), f"{self.runs}/{a}.log",
                          self._py(f"repro.bench.{a}", *prof, "--out", f"{self.runs}/{a}", *extra),
                          inputs=tuple(check if a in ("fig5", "fig6") else [self.envcheck] if a == "decode" else []),
                          threads=ranks, gpus=gpus,
                          settings=_digest([section.model_dump(), p.dtype]), what=f"the {a} benchmark"))
            self._report(a, [f"{self.runs}/{a}/bench.json"])
        for a in RL_ARTIFACTS:
            if getattr(p, a) is not None:
                self._plan_rl(a)

    def _report(self, artifact: str, runs: list[str]) -> None:
        tidy = f"{self.tidy}/{artifact}.csv"
        # this label's runs on every machine; with another engine than the profile's, this machine's only
        root = "results" if self.label == self.profile.name else self.runs
        self._add(Job("tidy", artifact, (tidy,), f"{self.tidy}/{artifact}.log",
                      self._py("repro.report.collect", "--results", root, "--artifact", artifact, "--profile",
                               self.profile.name, "--tidy-file", tidy, "--here", self.runs),
                      inputs=tuple(runs), local=True, what=f"{artifact}'s collected runs"))
        self._add(Job("report", artifact, (f"{self.figs}/{artifact}.md",), f"{self.runs}/reports/{artifact}.log",
                      self._py("repro.report.build", "--artifact", artifact, "--profile", self.profile.name,
                               "--tidy", tidy, "--out", self.figs),
                      inputs=(tidy,), local=True, what=f"{artifact}'s tables and figures"))

    # -- the RL artifacts (table1, table2, fig3, fig4) ------------------------------------------------------------
    def _plan_rl(self, a: str) -> None:
        section = getattr(self.profile, a)
        rows = section.rows
        runs: dict[str, tuple[str, int | None]] = {run_dir_name(r): (r, None) for r in rows}
        if section.baseline_seeds:
            if self.engine == "nemo-rl":
                raise ProfileError(f"profile {self.profile.name}: {a}.baseline_seeds is for the suite engine; the "
                                   "NeMo-RL driver takes no seed from this workflow (remove baseline_seeds)")
            base = sorted({s.baseline for s in rows.values()} - {None})
            if len(base) != 1:
                raise ProfileError(f"profile {self.profile.name}: {a}.baseline_seeds needs the rows to name one "
                                   f"baseline row; they name {base}")
            for k in dict.fromkeys(section.baseline_seeds):
                if k != self.seed:
                    runs[replica_run_name(run_dir_name(base[0]), k)] = (base[0], k)
        groups = self._lockstep_groups(a)
        markers = []
        in_group = {r for g in groups.values() for r in g}
        for policy, group in groups.items():
            markers.append(self._lockstep_job(a, policy, group))
            # the baseline's seed replicas in one more lockstep process (one process's compilations instead of one
            # per replica; a process of its own keeps the rows held on one device at the group's size)
            seeds = [f"{r}@{k}" for r, k in runs.values() if k is not None and r in group]
            if seeds:
                markers.append(self._lockstep_job(a, f"{policy}_seeds", seeds, sft_policy=policy))
        for run, (row, sampling) in runs.items():
            if row not in in_group:
                markers.append(self._row_job(a, run, row, sampling))
        summary = f"{self.runs}/{a}/summary/summary.json"
        self._add(Job("summary", a, (summary,), f"{self.runs}/{a}/summary.log",
                      self._py("repro.rl.summary", "--artifact", a, "--profile", shlex.quote(self.profile_arg),
                               "--runs", f"{self.runs}/{a}"),
                      inputs=tuple(markers), local=True, what=f"{a}'s summary rows"))
        self._report(a, markers + [summary])

    def _lockstep_groups(self, a: str) -> dict[str, list[str]]:
        """{policy: its rows, no-draft first} when the section asks for lockstep, else {}."""
        section = getattr(self.profile, a)
        if not section.lockstep:
            return {}
        if self.engine == "nemo-rl" or any(self._policy(a, r).get("checkpoint") for r in section.rows):
            raise ProfileError(f"profile {self.profile.name}: {a}.lockstep is for rows the suite trains in one "
                               "process (no NeMo-RL engine, no checkpoint policies on a torchrun mesh); remove it")
        groups: dict[str, list[str]] = {}
        for row in sorted(section.rows, key=lambda r: section.rows[r].draft is not None):
            groups.setdefault(section.rows[row].policy, []).append(row)
        return groups

    def _policy(self, a: str, row: str) -> dict:
        rl = self.profile.rl
        return dict(rl.policies.get(getattr(self.profile, a).rows[row].policy) or {}) if rl else {}

    def _workload(self, a: str) -> str:
        section, rl = getattr(self.profile, a), self.profile.rl
        return section.workload.get("name") or (rl.workload.name if rl else "math")

    def _sft(self, a: str, policy: str) -> str:
        """The SFT warm start of ``policy`` on ``a``'s workload (one job for every artifact sharing it)."""
        workload = self._workload(a)
        folder = f"{self.runs}/sft/{policy}-{workload}"
        out = f"{folder}/policy.pt"
        if out in self.jobs:
            return out
        drafts = sorted({s.draft for b in RL_ARTIFACTS if getattr(self.profile, b) is not None
                         and self._workload(b) == workload for s in getattr(self.profile, b).rows.values()
                         if s.policy == policy and s.draft})
        rl = self.profile.rl
        settings = [rl.policies[policy], {d: asdict(rl.drafts[d]) for d in drafts}, rl.sft.model_dump(),
                    rl.vocab_size, self.profile.dtype, workload, self.seed]
        reads_math = "math" in (workload, sft_spec({"sft": rl.sft.model_dump()}, workload).draft_workload)
        if reads_math and tuple(rl.workload.math_ops) != MATH_OPS:   # the default leaves the digests as they were
            settings.append(list(rl.workload.math_ops))
        self._add(Job("sft", "sft", (out,), f"{folder}.log",
                      self._py("repro.rl.sft", "--profile", shlex.quote(self.profile_arg), "--policy", policy,
                               "--workload", workload, "--drafts", shlex.quote(",".join(drafts)), "--seed",
                               str(self.seed), "--threads", "1", "--out", folder),
                      gpus=int(self.gpu), settings=_digest(settings),
                      what=f"SFT warm start of {policy} on {workload}"))
        return out

    def _row_settings(self, a: str, row: str) -> str:
        eff = effective_specs(self.profile, a, row)
        return _digest({k: asdict(v) if hasattr(v, "__dataclass_fields__") else
                        v.model_dump() if hasattr(v, "model_dump") else v for k, v in eff.items()})

    def _row_job(self, a: str, run: str, row: str, sampling: int | None) -> str:
        out_dir = f"{self.runs}/{a}/{run}"
        out = f"{out_dir}/run.json"
        seed = ["--seed", str(self.seed)] + ([] if sampling is None else ["--sampling-seed", str(sampling)])
        log, row_q = f"{self.runs}/{a}/{run}.log", shlex.quote(row)
        if self.engine == "nemo-rl":
            paths = [x for flag, key in (("--nemo-rl-dir", "nemo_rl_dir"), ("--checkpoint-root", "checkpoint_root"))
                     if self.config.get(key) for x in (flag, self.config[key])]
            nodes, gpus = self._nemo_layout(a, row)
            self._add(Job("rl", a, (out,), log, self._py(NEMO_RL_RUN, "--artifact", a, "--row", row_q,
                                                         "--profile", shlex.quote(self.profile_arg), "--out",
                                                         out_dir, *paths),
                          gpus=gpus, nodes=nodes, local=nodes > 1, what=f"{a} {row} on NeMo-RL"))
            return out
        engine = [] if self.profile.engine == "suite" else ["--engine", "suite"]
        policy = self._policy(a, row)
        if policy.get("checkpoint"):
            mesh = policy.get("mesh")
            if not mesh:
                name = getattr(self.profile, a).rows[row].policy
                raise ProfileError(f"profile {self.profile.name}: rl.policies.{name} loads a checkpoint but has no "
                                   "mesh: {pp, cp}, the layout of its torchrun run (repro.rl.dist_run)")
            world = mesh["pp"] * mesh["cp"]
            per_node = self.gpus_per_node()
            nodes = -(-world // per_node)
            args = ["-m", "repro.rl.dist_run", "--artifact", a, "--row", row_q, "--profile",
                    shlex.quote(self.profile_arg), *engine, "--checkpoint-root", self.config["checkpoint_root"],
                    "--pp", str(mesh["pp"]), "--cp", str(mesh["cp"]), "--out", out_dir, *seed,
                    "--log-artifact", "artifact", "--restart-on-config-change"]
            self._add(Job("rl", a, (out,), log, " ".join(self._torchrun(world, nodes) + args), gpus=world,
                          nodes=nodes, settings=self._row_settings(a, row), what=f"{a} {row} under torchrun"))
            return out
        sft = self._sft(a, getattr(self.profile, a).rows[row].policy)
        warm = sft.rsplit("/", 1)[0]
        cmd = self._py("repro.rl.run", "--artifact", a, "--row", row_q, "--profile", shlex.quote(self.profile_arg),
                       *engine, "--warm-start", warm, "--out", out_dir, *seed, "--threads", "1",
                       "--restart-on-config-change")
        self._add(Job("rl", a, (out,), log, cmd, inputs=(sft,), gpus=int(self.gpu),
                      settings=_digest([self._row_settings(a, row), sampling]), what=f"{a} {row}"))
        return out

    def _lockstep_job(self, a: str, name: str, rows: list[str], sft_policy: str | None = None) -> str:
        """One repro.rl.lockstep job over ``rows`` (labels, or label@k for a sampling-seed replica)."""
        sft = self._sft(a, sft_policy or name)
        out = f"{self.runs}/{a}/lockstep_{name}.json"
        cmd = self._py("repro.rl.lockstep", "--artifact", a, "--rows", shlex.quote(",".join(rows)), "--profile",
                       shlex.quote(self.profile_arg), "--warm-start", sft.rsplit("/", 1)[0], "--out-root",
                       f"{self.runs}/{a}", "--seed", str(self.seed), "--threads", "1", "--record", out,
                       "--restart-on-config-change")
        settings = [[self._row_settings(a, r.rpartition("@")[0]), r] if "@" in r else self._row_settings(a, r)
                    for r in rows]
        self._add(Job("lockstep", a, (out,), f"{self.runs}/{a}/lockstep_{name}.log", cmd, inputs=(sft,),
                      gpus=int(self.gpu), settings=_digest(settings),
                      what=f"{a} rows of {sft_policy or name} in lockstep"
                           + (" (the baseline's seed replicas)" if sft_policy else "")))
        return out

    def gpus_per_node(self) -> int:
        """GPUs of one node: the NeMo-RL section's gpus_per_node, else the profile's whole machine."""
        nemo = self.profile.nemo_rl
        return nemo.gpus_per_node if nemo is not None else max(1, self.profile.hardware.gpus)

    def _torchrun(self, world: int, nodes: int) -> list[str]:
        """torchrun on one node (--standalone), or one torchrun per node started by srun inside the job's SLURM
        allocation, meeting at a c10d rendezvous on the allocation's first node."""
        py = shlex.quote(self.python)
        if nodes == 1:
            return [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        head = "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
        return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", py, "-m", "torch.distributed.run",
                f"--nnodes={nodes}", f"--nproc-per-node={world // nodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={head}:29500", '--rdzv-id="$SLURM_JOB_ID"']

    def local_runs(self) -> list[str]:
        """Run folders whose job runs where snakemake runs: multi-node NeMo-RL rows, which submit NeMo-RL's
        ray.sub to SLURM themselves (a job inside an allocation must not wait on another allocation)."""
        return sorted({o.rsplit("/", 2)[-2] for j in self.jobs.values() if j.kind == "rl" and j.local
                       for o in j.outputs})

    def _nemo_layout(self, a: str, row: str) -> tuple[int, int]:
        """(nodes, GPUs) of a NeMo-RL row: its model's node count x the profile's GPUs per node."""
        nemo = self.profile.nemo_rl
        model = nemo.models.get(getattr(self.profile, a).rows[row].policy)
        nodes = model.nodes if model else 1
        return nodes, nodes * nemo.gpus_per_node


def main(argv: Iterable[str] | None = None) -> int:
    from repro.core.profile import load_profile_model
    from repro.core.provenance import hardware
    ap = argparse.ArgumentParser(description="Print the jobs the workflow plans for a profile on this machine.")
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--artifact", choices=ARTIFACTS + ("envcheck", "sft", "attention_check"), help="only this one")
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                    help="the workflow's --config values (engine, seed, checkpoint_root, nemo_rl_dir)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        plan = Plan(load_profile_model(args.profile), dict(kv.split("=", 1) for kv in args.config),
                    machine=hardware()["tag"], profile_arg=args.profile)
    except ProfileError as exc:
        print(f"plan: error: {exc}", file=sys.stderr)
        return 2
    seen = set()
    for job in plan.jobs.values():
        if id(job) in seen or (args.artifact and job.artifact != args.artifact):
            continue
        seen.add(id(job))
        res = f"{job.gpus} GPU" if job.gpus else f"{job.threads} thread{'s' * (job.threads > 1)}"
        print(f"[{job.kind} {job.artifact}] {job.what} ({res}) -> {', '.join(job.outputs)}\n    {job.cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
