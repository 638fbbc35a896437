"""Reproduction suite for "Online Draft Co-Training for Speculative Decoding in Large-Scale,
Long-Context RL Post-Training" (arXiv 2609.07108).

repro.report: environment capture, metrics logging (W&B + jsonl), collection, tables, figures.
repro.bench:  benchmark programs behind Figures 5-7 and envcheck.
"""
