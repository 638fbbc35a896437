"""vLLM as a decode peer in its own interpreter: a child process that serves ``generate`` calls over JSON lines.

vLLM pins another transformers than the suite's, so it lives in its own environment (``.venv-vllm``, made by
``bash scripts/setup.sh --vllm``). When the decode benchmark runs in the suite's environment, its ``vllm`` peer
(``repro.rollout.peers``) exports the policy and starts this module under the vLLM environment's interpreter:

    .venv-vllm/bin/python -m integrations.vllm.peer_server --policy-dir /tmp/run/vllm_peer/policy --max-model-len 48

Protocol (one JSON object per line; the child's own stdout is the protocol channel, everything vLLM prints goes to
stderr): the child answers ``{"ready": true, "vllm": <version>}`` once the engine has started, or
``{"error": <reason>}`` and exits 1. Then per request line ``{"prompts": [[ids]], "max_new_tokens": n,
"temperature": t, "seed": s}`` it answers ``{"tokens": [[ids]], "cpu_s": <process CPU seconds of the call>,
"wall_s": <wall seconds>}`` or ``{"error": <reason>}``. End of input ends the child. vLLM's engine core runs in
this process (``integrations.vllm.engine``), so ``cpu_s`` is all of the decode's CPU time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import IO, Any


def serve(engine, requests: IO[str], replies: IO[str]) -> int:
    """Answer each request line of ``requests`` with one reply line on ``replies`` until end of input."""
    for line in requests:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            t0, c0 = time.perf_counter(), time.process_time()
            out = engine.generate(req["prompts"], max_new_tokens=int(req["max_new_tokens"]),
                                  temperature=float(req.get("temperature", 1.0)), seed=int(req.get("seed", 0)))
            reply: dict[str, Any] = {"tokens": out.tokens, "cpu_s": time.process_time() - c0,
                                     "wall_s": time.perf_counter() - t0}
        except Exception as exc:          # noqa: BLE001 - the parent records the reason; the child keeps serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve vLLM decoding of an exported policy over JSON lines on "
                                             "stdin/stdout (the decode benchmark's vllm peer in another interpreter).")
    ap.add_argument("--policy-dir", required=True, help="the policy exported by integrations.vllm.export")
    ap.add_argument("--max-model-len", type=int, required=True, help="longest prompt + generation, in tokens")
    ap.add_argument("--dtype", default=None, help="vLLM's compute dtype (default: the one the exported config.json "
                                                  "names, float32 if none)")
    args = ap.parse_args(argv)
    # the protocol owns the real stdout; vLLM's logs and prints go to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        from integrations.vllm.engine import VllmRolloutEngine
        from integrations.vllm.export import exported_dtype
        engine = VllmRolloutEngine(args.policy_dir, max_model_len=args.max_model_len,
                                   dtype=args.dtype or exported_dtype(args.policy_dir))
    except Exception as exc:          # noqa: BLE001 - the parent gets the reason, not a traceback on a pipe
        replies.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        replies.flush()
        return 1
    replies.write(json.dumps({"ready": True, "vllm": engine.vllm_version}) + "\n")
    replies.flush()
    try:
        return serve(engine, sys.stdin, replies)
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
