"""The two RL workloads: single-turn math (``math``) and multi-turn workplace tool use (``workplace``).

Both are generated from a seed, need no hub, and expose the same pieces to the trainer: a prompt as
text, a worked demonstration for the supervised warm start, and a verifiable 0/1 reward.
"""
