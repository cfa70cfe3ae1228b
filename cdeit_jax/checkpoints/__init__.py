"""Checkpoints: the orbax format, building and loading models, the one reader of a workdir."""
