"""The model's variable kinds beyond `nnx.Param`: what training leaves alone and checkpoints
treat apart (a module of its own so that the model, the conditioning, training and the
checkpoint format share them without importing each other)."""

from flax import nnx


class Fixed(nnx.Variable):
  """A model variable that is not trained (tables, operators, calibration): recomputed from the
  config when a checkpoint loads, except `Calibration`, which the checkpoint records."""


class Calibration(Fixed):
  """Fixed values measured on the training set (set once by `conditioning.calibrate`)."""
