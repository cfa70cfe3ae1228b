"""The default configuration (the CDEIT authors' recipe) and helpers to load and use configs.

Config files in `configs/` are small ml_collections files with `get_config()` that start from
`default_config()` here and change what differs; keys of `model` are `CDEIT` argument names.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def default_config() -> ml_collections.ConfigDict:
  """The published model and diffusion."""
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(dict(
      image_size=128, patch_size=2, in_channels=1, hidden_size=512, num_heads=16, mlp_ratio=4.0,
      num_scales=4, window_size=config_dict.placeholder(int), cond_size=16, freq_dim=256,
      dtype="float32",  # compute dtype; parameters stay float32
      attention_impl=config_dict.placeholder(str),  # None (XLA picks), "xla" or "cudnn"
      remat=False))
  c.diffusion = ml_collections.ConfigDict(dict(num_steps=1000, beta_start=1e-4, beta_end=0.02))
  c.sampling = ml_collections.ConfigDict(dict(steps=5, eta=1.0))
  c.data = ml_collections.ConfigDict(dict(
      path=config_dict.placeholder(str),  # dataset root holding train/ valid/ test/
      preset="simulated",  # simulated | uef2017 | ktc2023 (sets the two ratios)
      voltage_ratio=config_dict.placeholder(float), current_ratio=config_dict.placeholder(float),
      stats=config_dict.placeholder(str),  # folder with mean/std; default: the dataset root
      skip_bad_files=False,  # True: skip unreadable/invalid files with a warning
      cache=True,  # keep decoded arrays in memory (CDEIT datasets are small)
      num_workers=0, num_threads=4, prefetch=8, seed=0))
  return c


def model_kwargs(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """`CDEIT(**model_kwargs(cfg), rngs=...)` arguments from a config's `model` section."""
  kw = dict(cfg.model)
  if kw.get("dtype") not in DTYPES:
    raise ValueError(f"config.model.dtype: {kw.get('dtype')!r} is not one of {sorted(DTYPES)}")
  kw["dtype"] = DTYPES[kw["dtype"]]
  impl = kw.get("attention_impl")
  if impl not in (None, "xla", "cudnn"):
    raise ValueError(f"config.model.attention_impl: {impl!r} must be unset, 'xla' or 'cudnn'")
  return kw


def load(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file (command lines use ml_collections' config_flags instead)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path}: no such file")
  spec = importlib.util.spec_from_file_location(f"_cdeit_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path}: defines no get_config()")
  return module.get_config()
