# Reproduction suite for "Online Draft Co-Training for Speculative Decoding in Large-Scale,
# Long-Context RL Post-Training" (arXiv 2609.07108).
#
#   snakemake -c2 all                                  # every artifact on the embedded default (cpu-tiny)
#   snakemake -c2 envcheck compare                     # machine ceilings + comparison reports
#   snakemake -c2 fig5 --config profile=h200           # one artifact on one GPU
#   snakemake --list-target-rules
#
# Rules: workflow/rules/ (one file per artifact); config schema: workflow/schemas/; profiles:
# experiments/profiles/. Outputs: results/<hw>/<profile>/<artifact>/ (runs), results/tidy/ (collected),
# paper_figures/<profile>/ (tables, figures, comparison reports).
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


configfile: "workflow/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/envcheck.smk"
include: "workflow/rules/collect.smk"


# One rule file per paper artifact, added by the issue that builds its experiment.
for _artifact in PAPER_ARTIFACTS:
    if Path(workflow.basedir, "workflow", "rules", f"{_artifact}.smk").is_file():

        include: f"workflow/rules/{_artifact}.smk"


include: "workflow/rules/all.smk"
