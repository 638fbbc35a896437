# Reproduction suite for "Online Draft Co-Training for Speculative Decoding in Large-Scale, Long-Context RL
# Post-Training" (arXiv 2609.07108).
#
#   snakemake -c2 table1                             # one artifact on the embedded default (cpu-tiny), measured here
#   snakemake -c2 all                                # every artifact, then collect and compare
#   snakemake -c16 fig6 --config profile=h200        # on one GPU
#   snakemake -n -p table1                           # the plan and its commands, nothing run
#   python -m repro.plan --profile h200              # the same plan, job by job
#
# The planner (repro/plan.py) decides the jobs; workflow/rules/ match files to them. Config: workflow/config.yaml
# (checked by workflow/schemas/config.schema.yaml); profiles: experiments/profiles/ (repro/core/profile.py).
# Outputs: results/<machine>/<profile>/<artifact>/ (this machine's runs), results/tidy/, paper_figures/<profile>/.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "workflow/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/jobs.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/targets.smk"
