"""A decode peer that runs in another interpreter: the client side of ``integrations.vllm.peer_server``'s protocol.

``ChildDecoder(argv, log=...)`` starts ``argv`` (a server speaking JSON lines on its stdin/stdout: ``{"ready":
true}`` once started, then one reply per request), waits for it to be ready and decodes through it:
``generate(prompts, max_new_tokens=..., temperature=..., seed=...)`` returns the token lists; ``cpu_s`` adds up the
process CPU seconds the child reports for its calls, so a benchmark can count the decode's CPU time, which is not
this process's. The child's stderr goes to ``log``; a child that fails, exits or stays silent past ``timeout_s``
raises ``ChildPeerError`` with its reason (and the tail of its log). ``close()`` ends it (a child that failed to
start is killed at once).

    peer = ChildDecoder([".venv-vllm/bin/python", "-m", "integrations.vllm.peer_server", "--policy-dir", d,
                         "--max-model-len", "48"], log=Path(d) / "server.log")
    tokens = peer.generate([[1, 2, 3]], max_new_tokens=8, temperature=1.0)
"""
from __future__ import annotations

import json
import selectors
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


class ChildPeerError(RuntimeError):
    """The child could not start, answered with an error, exited or did not answer in time."""


class ChildDecoder:
    def __init__(self, argv: Sequence[str], *, log: Path, cwd: str | Path | None = None, env: dict | None = None,
                 start_timeout_s: float = 600.0, timeout_s: float = 600.0):
        self.argv, self.log, self.timeout_s = list(argv), Path(log), timeout_s
        self.cpu_s = 0.0
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("w")
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log_file, cwd=cwd, env=env, text=True, bufsize=1)
        except OSError as exc:
            self._log_file.close()
            raise ChildPeerError(f"could not start {self.argv[0]!r}: {exc}") from exc
        try:
            hello = self._reply(start_timeout_s)
        except ChildPeerError:
            self.close(wait_s=0)
            raise
        if not hello.get("ready"):
            self.close(wait_s=0)
            raise ChildPeerError(f"the child did not start: {hello}")
        self.info = hello

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
                 seed: int = 0) -> list[list[int]]:
        req = {"prompts": [list(map(int, p)) for p in prompts], "max_new_tokens": int(max_new_tokens),
               "temperature": float(temperature), "seed": int(seed)}
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ChildPeerError(f"the child is gone ({exc}){self._log_tail()}") from exc
        reply = self._reply(self.timeout_s)
        self.cpu_s += float(reply["cpu_s"])
        return reply["tokens"]

    def _reply(self, timeout_s: float) -> dict:
        """The child's next line as JSON; an ``error`` reply, an exit or a silence past ``timeout_s`` raises."""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChildPeerError(f"no answer from the child in {timeout_s:.0f} s{self._log_tail()}")
                if sel.select(timeout=min(left, 1.0)):
                    break
                if self.proc.poll() is not None:
                    raise ChildPeerError(f"the child exited with code {self.proc.returncode}{self._log_tail()}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise ChildPeerError(f"the child exited with code {self.proc.returncode}{self._log_tail()}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise ChildPeerError(f"the child wrote {line[:200]!r}, not a JSON line") from None
        if "error" in reply:
            raise ChildPeerError(str(reply["error"]))
        return reply

    def _log_tail(self, lines: int = 8) -> str:
        self._log_file.flush()
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("; its log " + str(self.log) + " ends:\n" + "\n".join(tail)) if tail else ""

    def close(self, wait_s: float = 30.0) -> None:
        """End the child: end of input (it closes its engine and exits), killed if still running after ``wait_s``."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=wait_s)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
