"""A decode peer in another interpreter (repro.rollout.child_peer) speaking integrations.vllm.peer_server's protocol:
replies, CPU time carried back, errors, exits and silences reported with the child's log; the vllm peer's refusal
when no vLLM environment can serve it."""
from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from types import SimpleNamespace

import pytest

from integrations.vllm.peer_server import serve
from repro.rollout.child_peer import ChildDecoder, ChildPeerError
from repro.rollout.peers import PeerUnavailable, make_peer, vllm_interpreter

# a stand-in engine: each row's tokens are its prompt's last token + 1, 2, ...; it burns ~20 ms of CPU per call
FAKE_SERVER = textwrap.dedent("""
    import json, sys, time
    from types import SimpleNamespace
    from integrations.vllm.peer_server import serve

    class Engine:
        def generate(self, prompts, *, max_new_tokens, temperature, seed):
            if max_new_tokens > 100:
                raise ValueError(f"max_new_tokens={max_new_tokens} is over 100")
            t = time.process_time()
            while time.process_time() - t < 0.02:
                pass
            return SimpleNamespace(tokens=[[p[-1] + i + 1 for i in range(max_new_tokens)] for p in prompts])

    print("starting", file=sys.stderr)
    mode = sys.argv[1]
    if mode == "exit":
        sys.exit(3)
    if mode == "silent":
        time.sleep(60)
    print(json.dumps({"ready": True}), flush=True)
    serve(Engine(), sys.stdin, sys.stdout)
""")


def fake(tmp_path, mode: str, **kw) -> ChildDecoder:
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    return ChildDecoder([sys.executable, str(script), mode], log=tmp_path / "logs" / "server.log", env=env, **kw)


@pytest.mark.timeout(60)
def test_child_decodes_and_reports_its_cpu_time(tmp_path):
    peer = fake(tmp_path, "serve")
    try:
        assert peer.generate([[5, 7], [1, 2]], max_new_tokens=3, temperature=1.0) == [[8, 9, 10], [3, 4, 5]]
        first = peer.cpu_s
        assert first >= 0.02                       # the child's CPU time, not this process's
        assert peer.generate([[0]], max_new_tokens=1, temperature=0.5) == [[1]]
        assert peer.cpu_s >= first + 0.02
        with pytest.raises(ChildPeerError, match="max_new_tokens=101 is over 100"):
            peer.generate([[0]], max_new_tokens=101, temperature=1.0)
        assert peer.generate([[1]], max_new_tokens=2, temperature=1.0) == [[2, 3]]   # still serving after an error
    finally:
        peer.close()
    assert peer.proc.returncode == 0               # end of input ends the child cleanly
    assert "starting" in (tmp_path / "logs" / "server.log").read_text()


@pytest.mark.timeout(60)
def test_child_that_exits_is_reported_with_its_log(tmp_path):
    with pytest.raises(ChildPeerError, match=r"(?s)exited with code 3.*server\.log ends:.*starting"):
        fake(tmp_path, "exit")


@pytest.mark.timeout(60)
def test_silent_child_times_out_and_is_killed(tmp_path):
    with pytest.raises(ChildPeerError, match="no answer from the child in 1 s"):
        fake(tmp_path, "silent", start_timeout_s=1.0)


def test_child_that_cannot_start(tmp_path):
    with pytest.raises(ChildPeerError, match="could not start"):
        ChildDecoder([str(tmp_path / "no-such-python")], log=tmp_path / "log")


def test_serve_answers_each_request_line():
    engine = SimpleNamespace(generate=lambda prompts, **kw: SimpleNamespace(
        tokens=[[kw["max_new_tokens"]]] * len(prompts)))
    requests = io.StringIO(json.dumps({"prompts": [[1], [2]], "max_new_tokens": 4}) + "\n\nnot json\n")
    replies = io.StringIO()
    assert serve(engine, requests, replies) == 0
    first, second = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert first["tokens"] == [[4], [4]] and first["cpu_s"] >= 0 and first["wall_s"] >= 0
    assert second["error"].startswith("JSONDecodeError")


def test_vllm_interpreter_follows_the_environment(monkeypatch):
    monkeypatch.setenv("REPRO_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert vllm_interpreter() == "/opt/vllm/bin/python"
    monkeypatch.setenv("REPRO_VLLM_PYTHON", "")
    assert vllm_interpreter() is None


@pytest.mark.timeout(120)
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is importable here")
def test_vllm_peer_without_vllm_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    """No vLLM environment: refused at once. An interpreter without vLLM: the real server starts there, fails to
    import vLLM and says so; the benchmark records that reason."""
    from repro.models.policy import build_policy
    policy = build_policy("qwen3", "tiny", head_dim=32)
    monkeypatch.setenv("REPRO_VLLM_PYTHON", "")
    with pytest.raises(PeerUnavailable, match="no vLLM environment was found"):
        make_peer("vllm", policy, new_tokens=4, temperature=1.0, workdir=tmp_path)
    # another path to this interpreter (the same one is refused: it has no vLLM by the check above)
    wrapper = tmp_path / "python-without-vllm"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("REPRO_VLLM_PYTHON", str(wrapper))
    with pytest.raises(PeerUnavailable, match="could not start on this policy: ImportError: the vLLM rollout "
                                              "backend needs vLLM"):
        make_peer("vllm", policy, new_tokens=4, temperature=1.0, workdir=tmp_path)
    assert (tmp_path / "vllm_peer" / "policy" / "config.json").is_file()      # the export the child was given


@pytest.mark.timeout(60)
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is importable here")
def test_vllm_child_peer_names_the_version_the_child_reported(tmp_path, monkeypatch):
    """The decode benchmark records ``Peer.about`` beside the peer's timings: the child's vLLM version (from its
    ready line) and the interpreter it ran under."""
    import repro.rollout.peers as peers
    from repro.models.policy import build_policy
    started = []

    def child(argv, **kw):
        started.append(argv)
        return SimpleNamespace(info={"ready": True, "vllm": "0.99.1"}, cpu_s=0.0, close=lambda: None)
    monkeypatch.setattr(peers, "ChildDecoder", child)
    monkeypatch.setenv("REPRO_VLLM_PYTHON", "/opt/vllm/bin/python")
    peer = make_peer("vllm", build_policy("qwen3", "tiny", head_dim=32), new_tokens=4, temperature=1.0,
                     workdir=tmp_path)
    assert started and started[0][0] == "/opt/vllm/bin/python"
    assert peer.about == "vllm 0.99.1 (child process /opt/vllm/bin/python)"


def test_server_computes_in_the_dtype_the_export_names(tmp_path):
    """The vllm peer passes no dtype: the server reads it from the exported config (bf16 policy -> bfloat16)."""
    import torch

    from integrations.vllm.export import exported_dtype
    from repro.core.handoffs import policy_exporter
    from repro.models.policy import build_policy
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        out = policy_exporter("vllm")(build_policy("qwen3", "tiny", head_dim=32, dtype=dtype), tmp_path / name)
        assert exported_dtype(str(out)) == name
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert exported_dtype(str(tmp_path / "bare")) == "float32"
