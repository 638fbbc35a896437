"""GPU self-check of TapChannel's p2p transport over NCCL: the p2p cases of
``kernels.transport.selfcheck_gpu`` (PP-1 sources fan in to the draft's rank, one process per GPU, every tap
compared bit for bit with what was put); a verdict table and JSON. NCCL refuses two ranks on one device, so
PP=2 needs 2 GPUs and PP=4 needs 4; on fewer the cases say 'not run' and why, and the exit code is 3.

    python -m kernels.transport.selfcheck_p2p --out p2p_nccl.json
"""
from __future__ import annotations

import sys

from kernels.transport.selfcheck_gpu import main as selfcheck_main


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    return selfcheck_main(["--out", "p2p_nccl.json", *given, "--only", "p2p"])


if __name__ == "__main__":
    sys.exit(main())
