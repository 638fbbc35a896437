"""Single-turn math in the DAPO-Math-17K format, generated from a seed, with a verifiable integer reward.

Each problem is a chain of 2-3 integer operations on small numbers ("Start with 7. Add 5. Multiply by 3.
Subtract 4. What is the number now?"; ``workload.math_ops`` sets the range); the worked solution writes one
line per operation and ends with ``Answer: <int>``. The final answer cannot be produced without the
intermediate results, so the policy needs reasoning tokens, yet the task is learnable by a tiny policy.
Records follow the DAPO schema (``data_source``, ``prompt`` as a chat list with DAPO's instruction,
``ability``, ``reward_model.ground_truth``, ``extra_info.index``). The reward is DAPO's rule: the last
``Answer:`` line within the last 300 characters, compared as an integer; 1.0 or 0.0.

Splits: ``train`` (DAPO-Math-17K's role) and ``heldout`` (AIME 2024's role): 30 fixed problems of the
range's longest chain (three operations by default), never drawn for training. The seed picks the training
stream only: the held-out split is the same for every seed (one fixed evaluation set, as AIME 2024 is), so
runs of different seeds are validated on the same problems and none of them, nor the SFT warm start, trains
on them.

    python -m repro.rl.tasks.math --n 3          # print three DAPO-format records and their solutions
    python -m repro.rl.tasks.math --n 3 --ops 8 12   # longer chains (rl.workload.math_ops)
"""
from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass

from repro.core.specs import MATH_OPS

DAPO_INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should "
                    "be of the form Answer: $Answer where $Answer is the answer to the problem.\n\n{problem}"
                    "\n\nRemember to put your answer on its own line after \"Answer:\".")
SPLITS = ("train", "heldout")
HELDOUT_SEED = 0          # the one held-out split of every seed (seed 0 drew it before seeds stopped changing it)
HELDOUT_SIZE = 30
MAX_VALUE = 99
_ANSWER_RE = re.compile(r"Answer\s*:\s*(-?\d+)")


@dataclass(frozen=True)
class MathProblem:
    index: int
    start: int
    ops: tuple[tuple[str, int], ...]   # ("+", 5), ("-", 4), ("*", 3)
    answer: int

    @property
    def key(self) -> tuple:
        return (self.start, self.ops)

    @property
    def problem(self) -> str:
        words = {"+": "Add {}.", "-": "Subtract {}.", "*": "Multiply by {}."}
        return " ".join([f"Start with {self.start}."] + [words[o].format(v) for o, v in self.ops]
                        + ["What is the number now?"])

    @property
    def prompt_text(self) -> str:
        return DAPO_INSTRUCTION.format(problem=self.problem)

    @property
    def solution_text(self) -> str:
        lines, x = [], self.start
        for o, v in self.ops:
            y = _apply(x, o, v)
            lines.append(f"{x} {o} {v} = {y}")
            x = y
        return "\n".join(lines + [f"Answer: {self.answer}"])

    def to_dapo(self) -> dict:
        return {"data_source": "repro_synthetic_math", "prompt": [{"role": "user", "content": self.prompt_text}],
                "ability": "MATH", "reward_model": {"ground_truth": str(self.answer), "style": "rule"},
                "extra_info": {"index": self.index}}


def _apply(x: int, op: str, v: int) -> int:
    return x + v if op == "+" else x - v if op == "-" else x * v


def _random_problem(rng: random.Random, n_ops: int, index: int) -> MathProblem:
    x = rng.randint(1, 9)
    start, ops = x, []
    for _ in range(n_ops):
        choices = []
        if x + 1 <= MAX_VALUE:
            choices.append("+")
        if x >= 2:
            choices.append("-")
        if 1 <= x and 2 * x <= MAX_VALUE:
            choices.append("*")
        op = rng.choice(choices)
        if op == "+":
            v = rng.randint(1, min(9, MAX_VALUE - x))
        elif op == "-":
            v = rng.randint(1, min(9, x))
        else:
            v = rng.randint(2, min(4, MAX_VALUE // x))
        ops.append((op, v))
        x = _apply(x, op, v)
    return MathProblem(index, start, tuple(ops), x)


def dapo_reward(response: str, ground_truth: str | int) -> float:
    """DAPO's rule: the last ``Answer: <int>`` within the last 300 characters equals the ground truth."""
    found = _ANSWER_RE.findall(response[-300:])
    if not found:
        return 0.0
    try:
        return 1.0 if int(found[-1]) == int(ground_truth) else 0.0
    except ValueError:
        return 0.0


class MathTaskSet:
    """Seeded problem source; ``problems(split, n, draw)`` is a pure function of (seed, split, n, draw), and
    the held-out split does not depend on the seed."""

    def __init__(self, seed: int = 0, train_ops: tuple[int, int] = MATH_OPS, heldout_ops: int = MATH_OPS[1]):
        if not 1 <= train_ops[0] <= train_ops[1]:
            raise ValueError(f"train_ops must be (lo, hi) with 1 <= lo <= hi, got {train_ops}")
        if heldout_ops < 1:
            raise ValueError(f"heldout_ops must be >= 1, got {heldout_ops}")
        self.seed, self.train_ops, self.heldout_ops = seed, train_ops, heldout_ops
        rng = random.Random(f"heldout/{HELDOUT_SEED}")
        held: dict[tuple, MathProblem] = {}
        while len(held) < HELDOUT_SIZE:
            p = _random_problem(rng, heldout_ops, len(held))
            held.setdefault(p.key, p)
        self._heldout = list(held.values())
        self._heldout_keys = set(held)

    def problems(self, split: str, n: int, draw: int = 0) -> list[MathProblem]:
        """``n`` problems of ``split``; ``draw`` picks an independent batch (e.g. the training step)."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {SPLITS}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if split == "heldout":
            if n > HELDOUT_SIZE:
                raise ValueError(f"the heldout split has {HELDOUT_SIZE} problems, asked for {n}")
            return self._heldout[:n]
        rng = random.Random(f"train/{self.seed}/{draw}")
        out: list[MathProblem] = []
        while len(out) < n:
            p = _random_problem(rng, rng.randint(*self.train_ops), len(out))
            if p.key not in self._heldout_keys:
                out.append(p)
        return out


def math_tasks(seed: int, ops: tuple[int, int] = MATH_OPS) -> MathTaskSet:
    """The task set of a run whose problems have ``ops = (lo, hi)`` operations (``workload.math_ops``): training
    problems draw lo..hi, the held-out ones have hi (the hardest, as AIME's are)."""
    lo, hi = ops
    return MathTaskSet(seed, train_ops=(lo, hi), heldout_ops=hi)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, nargs=2, default=list(MATH_OPS), metavar=("LO", "HI"),
                    help="operations per problem (a profile's rl.workload.math_ops)")
    args = ap.parse_args(argv)
    for p in math_tasks(args.seed, tuple(args.ops)).problems("train", args.n):
        print(json.dumps(p.to_dapo()))
        print(p.solution_text, "\n")


if __name__ == "__main__":
    main()
