"""Multi-turn tool use in the spirit of the Workplace Assistant (WorkBench): tools over in-memory tables.

A workplace is five small tables (email, calendar, CRM, projects, and a people directory the others
refer to), drawn from a seed per task. The policy acts by writing tool calls
``<call>calendar.find name=standup</call>``; the environment executes them against the task's own
copy of the tables (after a configurable latency, the stand-in for a tool server round trip) and
answers ``<obs>id=2 day=tue time=10</obs>``. An episode ends when the policy writes end-of-sequence
or after ``max_tool_calls`` calls. The reward is outcome based, as in WorkBench: replay the
reference calls on a fresh copy of the tables; 1.0 iff every table of the episode equals it.

Task kinds (each needs 1 or 2 calls, a lookup before an update where ids are unknown): reschedule a
meeting, set a CRM deal stage, send an email, delete an email, update a project task's status.

    python -m repro.rl.tasks.workplace --n 2      # print two tasks with their demonstration dialogues
"""
from __future__ import annotations

import argparse
import copy
import random
import re
import time
from dataclasses import dataclass, field

PEOPLE = ("alice", "bob", "carol", "dave", "erin", "frank")
EVENTS = ("standup", "review", "planning", "retro", "sync", "demo")
DAYS = ("mon", "tue", "wed", "thu", "fri")
CUSTOMERS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
STAGES = ("lead", "qualified", "proposal", "won", "lost")
PROJECTS = ("apollo", "zephyr", "orion")
TASKS = ("design", "tests", "docs", "deploy")
STATUSES = ("todo", "doing", "done")
SUBJECTS = ("budget", "launch", "hiring", "offsite", "roadmap")
TOOLS = ("email.find", "email.delete", "email.send", "calendar.find", "calendar.move", "crm.update",
         "projects.find", "projects.update")
KINDS = ("reschedule", "crm", "send", "delete", "project")
SPLITS = ("train", "heldout")
HELDOUT_SEED = 0          # the one held-out split of every seed (seed 0 drew it before seeds stopped changing it)
TOOL_LIST = "Tools: " + " ".join(TOOLS) + "."
_CALL_RE = re.compile(r"^\s*([a-z]+\.[a-z]+)((?:\s+[a-z]+=[a-z0-9]+)*)\s*$")


class ToolError(ValueError):
    """A malformed or failing tool call; its message is what the policy observes."""


Tables = dict[str, list[dict]]


def random_tables(rng: random.Random) -> Tables:
    """A small workplace: 4 emails, 3 events, 4 customers, 4 project tasks."""
    emails = [{"id": i + 1, "person": rng.choice(PEOPLE), "subject": s, "folder": "inbox"}
              for i, s in enumerate(rng.sample(SUBJECTS, 4))]
    events = [{"id": i + 1, "name": n, "day": rng.choice(DAYS), "time": rng.choice((9, 10, 11, 14, 15, 16))}
              for i, n in enumerate(rng.sample(EVENTS, 3))]
    crm = [{"customer": c, "stage": rng.choice(STAGES), "owner": rng.choice(PEOPLE)}
           for c in rng.sample(CUSTOMERS, 4)]
    pairs = rng.sample([(p, t) for p in PROJECTS for t in TASKS], 4)
    projects = [{"id": i + 1, "project": p, "task": t, "status": rng.choice(STATUSES)}
                for i, (p, t) in enumerate(pairs)]
    return {"email": emails, "calendar": events, "crm": crm, "projects": projects}


def parse_call(text: str) -> tuple[str, dict[str, str]]:
    """``"calendar.move id=2 day=fri"`` -> ``("calendar.move", {"id": "2", "day": "fri"})``."""
    m = _CALL_RE.match(text)
    if not m:
        raise ToolError("error: malformed call")
    name = m.group(1)
    if name not in TOOLS:
        raise ToolError(f"error: unknown tool {name}")
    args = dict(kv.split("=", 1) for kv in m.group(2).split())
    return name, args


def _need(args: dict[str, str], *keys: str) -> list[str]:
    missing = [k for k in keys if k not in args]
    if missing:
        raise ToolError(f"error: missing {missing[0]}")
    return [args[k] for k in keys]


def _row(rows: list[dict], key: str, value) -> dict:
    for r in rows:
        if str(r[key]) == str(value):
            return r
    raise ToolError("error: not found")


def execute(tables: Tables, name: str, args: dict[str, str]) -> str:
    """Run one tool call against ``tables`` (mutated in place); returns the observation text."""
    if name == "email.find":
        person, subject = _need(args, "person", "subject")
        hits = [r for r in tables["email"] if r["person"] == person and r["subject"] == subject
                and r["folder"] == "inbox"]
        return f"id={hits[0]['id']}" if hits else "none"
    if name == "email.delete":
        (i,) = _need(args, "id")
        r = _row(tables["email"], "id", i)
        if r["folder"] != "inbox":
            raise ToolError("error: not found")
        r["folder"] = "trash"
        return "ok"
    if name == "email.send":
        person, subject = _need(args, "person", "subject")
        if person not in PEOPLE:
            raise ToolError("error: unknown person")
        tables["email"].append({"id": max(r["id"] for r in tables["email"]) + 1, "person": person,
                                "subject": subject, "folder": "sent"})
        return "ok"
    if name == "calendar.find":
        (n,) = _need(args, "name")
        r = _row(tables["calendar"], "name", n)
        return f"id={r['id']} day={r['day']} time={r['time']}"
    if name == "calendar.move":
        i, day = _need(args, "id", "day")
        if day not in DAYS:
            raise ToolError("error: bad day")
        _row(tables["calendar"], "id", i)["day"] = day
        return "ok"
    if name == "crm.update":
        c, stage = _need(args, "customer", "stage")
        if stage not in STAGES:
            raise ToolError("error: bad stage")
        _row(tables["crm"], "customer", c)["stage"] = stage
        return "ok"
    if name == "projects.find":
        p, t = _need(args, "project", "task")
        hits = [r for r in tables["projects"] if r["project"] == p and r["task"] == t]
        return f"id={hits[0]['id']} status={hits[0]['status']}" if hits else "none"
    if name == "projects.update":
        i, s = _need(args, "id", "status")
        if s not in STATUSES:
            raise ToolError("error: bad status")
        _row(tables["projects"], "id", i)["status"] = s
        return "ok"
    raise ToolError(f"error: unknown tool {name}")


@dataclass
class WorkplaceTask:
    index: int
    kind: str
    instruction: str
    tables: Tables                       # the initial state (never mutated)
    calls: list[str]                     # the reference calls, e.g. ["calendar.find name=standup", ...]

    @property
    def prompt_text(self) -> str:
        return f"{TOOL_LIST}\n{self.instruction}"

    def expected_tables(self) -> Tables:
        t = copy.deepcopy(self.tables)
        for c in self.calls:
            execute(t, *parse_call(c))
        return t

    def demo_turns(self) -> list[tuple[str, str]]:
        """The reference dialogue as (call text, observation text) pairs."""
        t = copy.deepcopy(self.tables)
        return [(c, execute(t, *parse_call(c))) for c in self.calls]

    def demo_text(self) -> str:
        body = "".join(f"<call>{c}</call><obs>{o}</obs>" for c, o in self.demo_turns())
        return f"{self.prompt_text} {body}done"


def _make_task(rng: random.Random, index: int) -> WorkplaceTask:
    tables = random_tables(rng)
    kind = rng.choice(KINDS)
    if kind == "reschedule":
        ev = rng.choice(tables["calendar"])
        day = rng.choice([d for d in DAYS if d != ev["day"]])
        calls = [f"calendar.find name={ev['name']}", f"calendar.move id={ev['id']} day={day}"]
        text = f"Move the {ev['name']} meeting to {day}."
    elif kind == "crm":
        c = rng.choice(tables["crm"])
        stage = rng.choice([s for s in STAGES if s != c["stage"]])
        calls = [f"crm.update customer={c['customer']} stage={stage}"]
        text = f"Set the deal stage of {c['customer']} to {stage}."
    elif kind == "send":
        person, subject = rng.choice(PEOPLE), rng.choice(SUBJECTS)
        calls = [f"email.send person={person} subject={subject}"]
        text = f"Send an email to {person} about {subject}."
    elif kind == "delete":
        e = rng.choice(tables["email"])
        calls = [f"email.find person={e['person']} subject={e['subject']}", f"email.delete id={e['id']}"]
        text = f"Delete the email from {e['person']} about {e['subject']}."
    else:
        r = rng.choice(tables["projects"])
        status = rng.choice([s for s in STATUSES if s != r["status"]])
        calls = [f"projects.find project={r['project']} task={r['task']}",
                 f"projects.update id={r['id']} status={status}"]
        text = f"Mark the {r['task']} task of project {r['project']} as {status}."
    return WorkplaceTask(index, kind, text, tables, calls)


class WorkplaceTaskSet:
    """Seeded task source; ``tasks(split, n, draw)`` is a pure function of its arguments; the seed picks the
    training stream, the held-out split is the same for every seed."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def tasks(self, split: str, n: int, draw: int = 0) -> list[WorkplaceTask]:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {SPLITS}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        # train and heldout draw from disjoint seed streams; states are random, so tasks differ. The held-out
        # split is the same for every seed (one fixed evaluation set): runs of different seeds validate alike
        rng = random.Random(f"train/{self.seed}/{draw}" if split == "train" else f"heldout/{HELDOUT_SEED}/0")
        return [_make_task(rng, i) for i in range(n)]


@dataclass
class WorkplaceEnv:
    """One episode's live state: executes calls (with latency) and scores the final tables."""

    task: WorkplaceTask
    latency_s: float = 0.0
    max_tool_calls: int = 4
    tables: Tables = field(init=False)
    n_calls: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"tool latency_s must be >= 0, got {self.latency_s}")
        if self.max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be >= 1, got {self.max_tool_calls}")
        self.tables = copy.deepcopy(self.task.tables)

    @property
    def exhausted(self) -> bool:
        return self.n_calls >= self.max_tool_calls

    def step(self, call_text: str) -> str:
        """Execute one call written by the policy; returns the observation (errors are observations)."""
        self.n_calls += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        try:
            return execute(self.tables, *parse_call(call_text))
        except ToolError as exc:
            return str(exc)

    def reward(self) -> float:
        return 1.0 if self.tables == self.task.expected_tables() else 0.0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for t in WorkplaceTaskSet(args.seed).tasks("train", args.n):
        print(t.kind, "|", t.demo_text(), "\n")


if __name__ == "__main__":
    main()
