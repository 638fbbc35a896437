"""The paper's numbers (experiments/paper_numbers.csv): loading and schema check.

Every number of ../shared/PAPER.md lives in that one tidy file, one row per number: artifact, row,
metric, stat (value / min / max of a stated range), unit, paper hardware, value, direction, the
ceiling it scales with, and where in the paper it stands. Nothing else in the suite holds a paper number.

    python -m repro.report.paper        # validate and print a summary
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from repro.core.profile import ProfileError, describe_error
from repro.core.provenance import REPO_ROOT

PAPER_NUMBERS = REPO_ROOT / "experiments" / "paper_numbers.csv"
ARTIFACTS = ("table1", "table2", "fig3", "fig4", "fig5", "fig6", "fig7")
Text = Annotated[str, Field(min_length=1)]


class PaperNumber(BaseModel):
    """One row of paper_numbers.csv: one number the paper reports."""
    model_config = ConfigDict(extra="forbid")
    artifact: Literal[ARTIFACTS]                       # type: ignore[valid-type]
    row: Text
    metric: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    stat: Literal["value", "min", "max"]               # value: a point; min/max: the ends of a reported range
    unit: Text
    paper_hardware: Annotated[str, Field(pattern=r"(H100|GB200)")]
    value: float
    higher_is_better: StrictBool
    scales_with: Literal["none", "flops", "mem_bw", "p2p_bw"]   # the ceiling it scales with (expected ratio)
    source: Text


def load_paper_numbers(path: Path = PAPER_NUMBERS) -> pd.DataFrame:
    """Read and validate every row (``PaperNumber``); ProfileError naming the line otherwise."""
    df = pd.read_csv(path, dtype={"row": str, "metric": str, "source": str}, keep_default_na=False)
    df["higher_is_better"] = df["higher_is_better"].map({"true": True, "false": False, True: True, False: False})
    for i, rec in enumerate(df.to_dict("records"), start=2):
        try:
            PaperNumber.model_validate(rec)
        except ValidationError as exc:
            raise ProfileError(f"{path.name} line {i}: {describe_error(exc.errors()[0])}") from None
    dup = df.duplicated(["artifact", "row", "metric", "stat"])
    if dup.any():
        first = df[dup].iloc[0]
        raise ProfileError(f"{path.name}: duplicate number {first['artifact']}/{first['row']}/{first['metric']}/"
                           f"{first['stat']}")
    return df


if __name__ == "__main__":
    df = load_paper_numbers()
    print(df.groupby("artifact").size().to_string())
    sys.exit(0)
