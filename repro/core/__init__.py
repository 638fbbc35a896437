"""The suite's ground floor, importable from everywhere: provenance, atomic writes, the profile model, the metrics
logger, timing and progress. Nothing here imports the rest of the suite."""
