"""Target-feature transport across pipeline stages (TapChannel) and its baselines.

See ``kernels.transport.channel`` for the protocol, ``kernels.transport.transports`` for the
transports, ``kernels.transport.probe`` for the one-sided GPU capabilities of the installed torch.
"""
from kernels.transport.channel import ChannelStats, TapChannel
from kernels.transport.spec import (
                                    ChannelLayout,
                                    PeerDiedError,
                                    StampMismatchError,
                                    TapChannelError,
                                    TapSpec,
                                    TapTimeoutError,
                                    sequence_stamp,
)

__all__ = [
                                    "ChannelLayout",
                                    "ChannelStats",
                                    "PeerDiedError",
                                    "StampMismatchError",
                                    "TapChannel",
                                    "TapChannelError",
                                    "TapSpec",
                                    "TapTimeoutError",
                                    "sequence_stamp",
]
