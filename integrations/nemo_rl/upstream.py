"""Generated configs checked by NeMo-RL itself: its loader and MasterConfig, run in the checkout's environment.

With a checkout, ``check_in_checkout`` runs integrations/nemo_rl/upstream_check.py through the checkout's
``uv run`` (a subprocess: NeMo-RL is never imported into the suite) and raises UpstreamError naming
every key NeMo-RL rejects (``policy.megatron_cfg.moe_per_layer_logging: Field required``) or a draft
key the checkout's DraftConfig lacks. Without one (CI), ``recorded_errors`` checks a config against a
record of a NeMo-RL commit: MasterConfig's JSON schema, DraftConfig's keys and the example configs,
resolved, with free-text strings replaced by placeholders (tests/integrations/nemo_rl/fixtures/nemo_rl-<commit>/).

    python -m integrations.nemo_rl.upstream record --nemo-rl-dir /path/to/RL --note "main" \
        --out tests/integrations/nemo_rl/fixtures/nemo_rl-<sha7>/recorded.json
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from integrations.nemo_rl.skeleton import EXAMPLES, merge
from repro.core.io import write_json_atomic
from repro.core.provenance import git_state

SCRIPT = Path(__file__).with_name("upstream_check.py")
DRAFT_PATH = "policy.draft"
DEFAULT_TIMEOUT_S = 1800.0     # the first ``uv run`` in a fresh checkout syncs its environment


class UpstreamError(ValueError):
    """A config NeMo-RL's own loader or MasterConfig rejects, or a draft key its DraftConfig lacks."""


def run_in_checkout(nemo: Path, args: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """upstream_check.py ARGS in the checkout's environment (``uv run`` from the checkout); its JSON answer."""
    cmd = ["uv", "run", "python", str(SCRIPT), *args]
    try:
        done = subprocess.run(cmd, cwd=nemo, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise UpstreamError(f"uv is not on PATH: NeMo-RL's own config check runs `uv run` in the checkout {nemo} "
                            "(https://docs.astral.sh/uv/); or pass --no-upstream-check") from exc
    except subprocess.TimeoutExpired as exc:
        raise UpstreamError(f"`{' '.join(cmd)}` in {nemo} did not answer within {timeout_s:.0f} s") from exc
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise UpstreamError(f"`{' '.join(cmd)}` in {nemo} failed (exit {done.returncode}):\n{tail}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise UpstreamError(f"`{' '.join(cmd)}` in {nemo} printed no JSON answer: {lines[-1][:300]!r}") from exc


def describe(errors: list[dict[str, str]]) -> str:
    return "; ".join(f"{e['key'] or '<config>'}: {e['error']}" + (f" (as {e['branch']})" if e.get("branch") else "")
                     for e in errors)


def check_in_checkout(configs: list[Path], nemo: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Raise UpstreamError unless NeMo-RL at ``nemo`` accepts every config; return its commit."""
    sha = git_state(nemo)["sha"]
    results = run_in_checkout(nemo, ["validate", *map(str, configs)], timeout_s)
    bad = [r for r in results if not r["ok"]]
    if bad:
        raise UpstreamError(" | ".join(f"NeMo-RL @ {sha[:12]} ({nemo}) rejects {r['config']}: {describe(r['errors'])}"
                                       for r in bad))
    return sha


# -- a recorded NeMo-RL commit (CI: no checkout, no NeMo-RL environment) ------------------------------------
_KEPT_STRING = re.compile(r"^[a-z0-9_.+-]{1,40}$")   # enum-like values (optimizer names, dtypes); others: "x"


def placeholder(value: Any) -> Any:
    """A resolved example config with its free-text strings (paths, model names, prompts) replaced."""
    if isinstance(value, dict):
        return {k: placeholder(v) for k, v in value.items()}
    if isinstance(value, list):
        return [placeholder(v) for v in value]
    if isinstance(value, str) and not _KEPT_STRING.match(value):
        return "x"
    return value


def _strip_text(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_text(v) for k, v in schema.items() if k not in ("description", "title", "examples")}
    if isinstance(schema, list):
        return [_strip_text(v) for v in schema]
    return schema


def record(nemo: Path, note: str = "", examples: tuple[str, ...] = EXAMPLES,
           commit: str | None = None) -> dict[str, Any]:
    """A record of the checkout's MasterConfig schema, DraftConfig keys and example configs
    (``commit``: for an exported tree that is not a git checkout)."""
    missing = [e for e in examples if not (nemo / e).is_file()]
    if missing:
        raise UpstreamError(f"{nemo} lacks the example configs {', '.join(missing)}")
    answer = run_in_checkout(nemo, ["schema"])
    return {"nemo_rl_commit": commit or git_state(nemo)["sha"], "note": note,
            "recorded_with": "python -m integrations.nemo_rl.upstream record",
            "master_config": _strip_text(answer["master_config"]), "draft_keys": answer["draft_keys"],
            "examples": {e: placeholder(run_in_checkout(nemo, ["resolve", e])) for e in examples}}


def load_recorded(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    for key in ("nemo_rl_commit", "master_config", "draft_keys", "examples"):
        if key not in data:
            raise UpstreamError(f"{path}: not a recorded NeMo-RL commit (no {key!r})")
    return data


def _branch(error: Any) -> str:
    """The union branch a jsonschema error sits in, named as pydantic names it (the $defs class)."""
    parent, path = error.parent, list(error.relative_schema_path)
    if parent is None or parent.validator not in ("anyOf", "oneOf") or not path or not isinstance(path[0], int):
        return ""
    return parent.validator_value[path[0]].get("$ref", "").rsplit("/", 1)[-1]


def schema_errors(cfg: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, str]]:
    """MasterConfig's validation replayed on its recorded JSON schema, errors as upstream_check reports them."""
    import jsonschema

    out: list[dict[str, str]] = []

    def walk(err: Any, branch: str) -> None:
        if err.context:
            for sub in err.context:
                walk(sub, _branch(sub) or branch)
            return
        keys = [str(p) for p in err.absolute_path]
        if err.validator == "required":
            for name in sorted(set(err.validator_value) - set(err.instance)):
                out.append({"key": ".".join(keys + [name]), "error": "Field required", "branch": branch})
        else:
            out.append({"key": ".".join(keys), "error": err.message[:200], "branch": branch})

    for err in jsonschema.Draft202012Validator(schema).iter_errors(cfg):
        walk(err, "")
    return out


def recorded_errors(generated: dict[str, Any], recorded: dict[str, Any], example: str) -> list[dict[str, str]]:
    """What NeMo-RL at the recorded commit would say of ``generated`` (a config inheriting ``example``)."""
    if example not in recorded["examples"]:
        raise UpstreamError(f"example {example!r} is not recorded (recorded: {', '.join(recorded['examples'])})")
    cfg = merge(recorded["examples"][example], {k: v for k, v in generated.items() if k != "defaults"})
    errors = schema_errors(cfg, recorded["master_config"])
    draft, known = (cfg.get("policy") or {}).get("draft"), set(recorded["draft_keys"])
    if isinstance(draft, dict):
        errors += [{"key": f"{DRAFT_PATH}.{k}", "branch": "",
                    "error": f"not a key of the checkout's DraftConfig ({', '.join(sorted(known))})"}
                   for k in sorted(set(draft) - known)]
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record a NeMo-RL checkout's MasterConfig schema and example configs")
    rec.add_argument("--nemo-rl-dir", type=Path, required=True)
    rec.add_argument("--note", default="", help="what the commit is (branch, PRs), written into the record")
    rec.add_argument("--commit", help="the commit, where --nemo-rl-dir is an exported tree, not a git checkout")
    rec.add_argument("--out", type=Path, required=True)
    chk = sub.add_parser("check", help="validate configs with NeMo-RL's loader and MasterConfig in the checkout")
    chk.add_argument("--nemo-rl-dir", type=Path, required=True)
    chk.add_argument("configs", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "record":
            data = record(args.nemo_rl_dir.resolve(), args.note, commit=args.commit)
            write_json_atomic(args.out, data)
            print(f"recorded NeMo-RL @ {data['nemo_rl_commit'][:12]} -> {args.out}")
        else:
            sha = check_in_checkout([c.resolve() for c in args.configs], args.nemo_rl_dir.resolve())
            print(f"NeMo-RL @ {sha[:12]} accepts {len(args.configs)} config(s)")
    except (UpstreamError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
