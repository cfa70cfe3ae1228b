"""Inference: the sampler, the Reconstructor, evaluation, metrics and outputs."""
