"""Every command in the README, docs/ and the studies' READMEs runs as written: workflow commands as dry runs
(nothing measured), module commands down to their --help, the rest by the files they name.

    .venv/bin/python -m pytest -q tests/workflow/test_docs.py
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "studies").glob("*/README.md"))]


def commands(path: Path) -> list[str]:
    """The shell commands of a Markdown file's ```bash blocks (continuations joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


ALL = [(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in commands(p)]


def test_the_docs_have_commands():
    assert len(ALL) >= 15 and all(p.is_file() for p in DOCS)


def check(cmd: str) -> list[str] | None:
    """The cheap form of ``cmd`` to run, or None when it is only checked by the files it names."""
    argv = shlex.split(cmd)
    if argv[0] in (".venv/bin/snakemake", "snakemake"):
        return [sys.executable, "-m", "snakemake", *argv[1:], *([] if "-n" in argv else ["-n"])]
    if argv[0] in (".venv/bin/python", "python") and argv[1] == "-m" and argv[2] != "pytest":
        return [sys.executable, "-m", argv[2], "--help"]
    if argv[0] in (".venv/bin/torchrun", "torchrun"):
        return [sys.executable, "-m", argv[argv.index("-m") + 1], "--help"]
    if argv[0] == ".venv/bin/repro":
        return [sys.executable, "-m", "repro.cli", *argv[1:]]
    if argv[:2] == ["bash", "scripts/setup.sh"]:
        return ["bash", "scripts/setup.sh", "--help"]
    return None


@pytest.mark.parametrize("doc,cmd", ALL, ids=[f"{d}: {c[:60]}" for d, c in ALL])
def test_command_runs_as_written(doc, cmd):
    run = check(cmd)
    if run is None:
        named = [a for a in shlex.split(cmd) if "/" in a and not a.startswith(("/", "-", "<")) and "*" not in a
                 and "$" not in a and not a.startswith(".venv")]
        for name in named:
            assert (ROOT / name.split("::")[0]).exists(), f"{doc}: `{cmd}` names {name}, which does not exist"
        return
    out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert out.returncode == 0, f"{doc}: `{cmd}` failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
