"""The workloads and the tokenizer: DAPO-format math with its reward rule, the workplace tools and their
final-state reward, the local BPE tokenizer. All CPU, milliseconds.

    .venv/bin/python -m pytest -q tests/rl/test_tasks.py
"""
import time

import pytest

from repro.rl.tasks.math import HELDOUT_SIZE, MathTaskSet, dapo_reward, math_tasks
from repro.rl.tasks.workplace import ToolError, WorkplaceEnv, WorkplaceTaskSet, execute, parse_call
from repro.rl.tokenizer import SPECIAL_TOKENS, WorkloadTokenizer


def test_math_problems_are_seeded_and_solutions_are_right():
    a = MathTaskSet(seed=3).problems("train", 20, draw=5)
    b = MathTaskSet(seed=3).problems("train", 20, draw=5)
    c = MathTaskSet(seed=3).problems("train", 20, draw=6)
    assert [p.key for p in a] == [p.key for p in b] and [p.key for p in a] != [p.key for p in c]
    for p in a:
        assert dapo_reward(p.solution_text, p.answer) == 1.0
        assert 2 <= len(p.ops) <= 3 and 0 <= p.answer <= 99
        assert len(p.solution_text.splitlines()) == len(p.ops) + 1      # one reasoning line per operation
        rec = p.to_dapo()
        assert rec["ability"] == "MATH" and rec["reward_model"]["ground_truth"] == str(p.answer)
        assert rec["prompt"][0]["role"] == "user" and "Answer: $Answer" in rec["prompt"][0]["content"]


def test_heldout_split_is_fixed_and_never_drawn_for_training():
    ts = MathTaskSet(seed=0)
    held = {p.key for p in ts.problems("heldout", HELDOUT_SIZE)}
    assert len(held) == HELDOUT_SIZE
    for draw in range(30):
        assert not held & {p.key for p in ts.problems("train", 64, draw=draw)}
    with pytest.raises(ValueError, match="heldout split has 30"):
        ts.problems("heldout", 31)
    with pytest.raises(ValueError, match="split 'test'"):
        ts.problems("test", 1)


def test_math_ops_set_the_chain_length_and_the_default_is_the_original_split():
    long = math_tasks(seed=3, ops=(8, 12))
    train = long.problems("train", 64, draw=1)
    assert {len(p.ops) for p in train} <= set(range(8, 13)) and len({len(p.ops) for p in train}) > 1
    assert all(dapo_reward(p.solution_text, p.answer) == 1.0 and 0 <= p.answer <= 99 for p in train)
    held = long.problems("heldout", HELDOUT_SIZE)
    assert all(len(p.ops) == 12 for p in held)                 # the held-out split is the range's longest chain
    assert not {p.key for p in held} & {p.key for p in train}
    default = [p.key for p in math_tasks(seed=3).problems("heldout", HELDOUT_SIZE)]
    assert default == [p.key for p in MathTaskSet(seed=3).problems("heldout", HELDOUT_SIZE)]
    assert [p.key for p in math_tasks(3).problems("train", 8, draw=2)] == \
        [p.key for p in MathTaskSet(3).problems("train", 8, draw=2)]


def test_every_seed_validates_on_the_same_heldout_split_and_never_trains_on_it():
    """A baseline's seed replicas are judged against seed-0 rows on validation accuracy: the held-out split must
    not move with the seed (else replicas would be validated on other problems, some of which the seed-0 SFT
    warm start trained on). Seed 0's problems are pinned: the committed seed-0 runs stay valid."""
    import hashlib

    def digest(xs):
        return hashlib.sha256(repr(xs).encode()).hexdigest()[:16]

    held0 = [p.key for p in MathTaskSet(seed=0).problems("heldout", HELDOUT_SIZE)]
    assert digest(held0) == "467f5ec18e1b9834"
    assert digest([p.key for p in MathTaskSet(seed=0).problems("train", 8, draw=3)]) == "395c8f0ce10d8f36"
    for seed in (1, 2, 7):
        ts = MathTaskSet(seed=seed)
        assert [p.key for p in ts.problems("heldout", HELDOUT_SIZE)] == held0
        train = [p.key for draw in range(20) for p in ts.problems("train", 64, draw=draw)]
        assert not set(held0) & set(train)
        assert train[:64] != [p.key for p in MathTaskSet(seed=0).problems("train", 64)], "seeds draw other streams"
    wp0 = [t.prompt_text for t in WorkplaceTaskSet(seed=0).tasks("heldout", 30)]
    assert digest(wp0) == "944b7ed3271ccf88"
    assert [t.prompt_text for t in WorkplaceTaskSet(seed=3).tasks("heldout", 30)] == wp0
    assert ([t.prompt_text for t in WorkplaceTaskSet(seed=3).tasks("train", 8)]
            != [t.prompt_text for t in WorkplaceTaskSet(seed=0).tasks("train", 8)])


@pytest.mark.parametrize("text,gt,want", [
    ("3 + 4 = 7\nAnswer: 7", 7, 1.0), ("Answer: 8", 7, 0.0), ("Answer: 7\nAnswer: 9", 9, 1.0),
    ("the answer is 7", 7, 0.0), ("Answer:-2", -2, 1.0), ("x" * 400 + "Answer: 5", 5, 1.0),
    ("Answer: 5" + "x" * 400, 5, 0.0)])
def test_dapo_reward_rule(text, gt, want):
    assert dapo_reward(text, gt) == want


def test_workplace_reference_calls_score_one_and_wrong_calls_zero():
    for task in WorkplaceTaskSet(seed=1).tasks("train", 25):
        env = WorkplaceEnv(task)
        assert env.reward() == 0.0                       # untouched tables differ from the goal
        for call, obs in task.demo_turns():
            assert env.step(call) == obs
        assert env.reward() == 1.0
    task = WorkplaceTaskSet(seed=1).tasks("train", 1)[0]
    env = WorkplaceEnv(task)
    assert env.step("crm.update customer=nobody stage=won").startswith("error")
    assert env.step("send the email please") == "error: malformed call"
    assert env.reward() == 0.0


def test_tool_errors_and_latency():
    with pytest.raises(ToolError, match="unknown tool"):
        parse_call("files.delete id=1")
    task = WorkplaceTaskSet(seed=2).tasks("heldout", 1)[0]
    with pytest.raises(ToolError, match="missing day"):
        execute(dict(task.tables), "calendar.move", {"id": "1"})
    env = WorkplaceEnv(task, latency_s=0.05)
    t0 = time.perf_counter()
    env.step(task.calls[0])
    assert time.perf_counter() - t0 >= 0.05
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        WorkplaceEnv(task, latency_s=-1)


def test_tokenizer_round_trips_and_pins_special_ids(tok):
    assert tok.vocab_size == 300
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.tok.token_to_id(name) == i
    text = MathTaskSet(0).problems("train", 1)[0].solution_text + "\n123 ünïcode"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode("<call>calendar.find name=sync</call>")[0] == tok.call_id
    assert [tok.decode([i]) for i in tok.encode("123")] == ["1", "2", "3"]   # digits one per token


def test_tokenizer_load_checks_special_ids(tmp_path, tok):
    tok.save(tmp_path)
    assert WorkloadTokenizer.load(tmp_path).vocab_size == 300
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        WorkloadTokenizer.load(tmp_path / "missing")
