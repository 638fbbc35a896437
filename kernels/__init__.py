"""The paper's two systems mechanisms, free of models and RL.

kernels.attention: packed zigzag ring attention, trunk+branch attention merged by LSE, the USP
baseline, attention backends and the fp64 dense reference.
kernels.transport: TapChannel (target features across pipeline stages) and the host-staging baseline.
kernels.launch: a small multi-process launcher (gloo/NCCL) used by tests and CPU benchmarks.

Note: this package deliberately defines no ``__version__``; transformers probes an unrelated
``kernels`` distribution by import name and must not mistake this package for it.
"""
