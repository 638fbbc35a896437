"""One intra-op thread: the test problems are tiny and the CI machine's 2 cores are shared."""
import torch

torch.set_num_threads(1)
