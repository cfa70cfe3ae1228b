"""The network: the CDEIT transformer, its attention backends, the diffusion and FLOP counts."""
