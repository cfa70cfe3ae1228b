"""Compile-only devices of a named topology, for compiling a run's programs without the hardware
(`train.py --compile_topology`, `cdeit_jax.train.aot`): TPU slices through libtpu (`v5e-8`, ...)
and one host of NVIDIA GPUs through JAX's CUDA plugin and XLA's own description of the chip
(`h100-8`, `h200-1`, ...; no GPU, driver or libcuda: `pip install -e '.[cuda-aot]'`).

The GPU descriptions are XLA's target specs (`GpuTargetConfigProto` text), kept in
cdeit_jax/assets/gpu_targets (their source, commit and licence in the README there): jaxlib does
not ship them, and a spec newer than the installed jaxlib's proto does not parse.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from importlib import resources

from cdeit_jax.common.device_memory import GIB
from cdeit_jax.common.errors import InputError


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  topology_name: str
  chip_config_name: str  # "megacore" (v4, v5p: one device per chip) or "default"
  chips_per_host_bounds: tuple[int, int, int]
  hbm_bytes: int  # usable HBM per device, as the TPU compiler reports it


_V4, _V5E, _V5P, _V6E = 30.75 * GIB, 15.75 * GIB, 95.74 * GIB, 31.25 * GIB
TPU = {
  "v4-8": TpuSlice("v4:2x2x1", "megacore", (2, 2, 1), _V4),
  "v4-16": TpuSlice("v4:2x2x2", "megacore", (2, 2, 1), _V4),
  "v4-32": TpuSlice("v4:2x2x4", "megacore", (2, 2, 1), _V4),
  "v5e-1": TpuSlice("v5e:1x1", "default", (1, 1, 1), _V5E),
  "v5e-4": TpuSlice("v5e:2x2", "default", (2, 2, 1), _V5E),
  "v5e-8": TpuSlice("v5e:2x4", "default", (2, 4, 1), _V5E),
  "v5e-16": TpuSlice("v5e:4x4", "default", (2, 2, 1), _V5E),
  "v5e-32": TpuSlice("v5e:4x8", "default", (2, 2, 1), _V5E),
  "v5e-64": TpuSlice("v5e:8x8", "default", (2, 2, 1), _V5E),
  "v5p-8": TpuSlice("v5:2x2x1", "megacore", (2, 2, 1), _V5P),
  "v5p-16": TpuSlice("v5:2x2x2", "megacore", (2, 2, 1), _V5P),
  "v5p-32": TpuSlice("v5:2x2x4", "megacore", (2, 2, 1), _V5P),
  "v6e-1": TpuSlice("v6e:1x1", "default", (1, 1, 1), _V6E),
  "v6e-4": TpuSlice("v6e:2x2", "default", (2, 2, 1), _V6E),
  "v6e-8": TpuSlice("v6e:2x4", "default", (2, 4, 1), _V6E),
  "v6e-16": TpuSlice("v6e:4x4", "default", (2, 2, 1), _V6E),
  "v6e-32": TpuSlice("v6e:4x8", "default", (2, 2, 1), _V6E),
}

# GPU name -> XLA's target spec of that chip (cdeit_jax/assets/gpu_targets); `NAME-N` is one host
# with N of them
GPU = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb"}
MAX_GPUS = 8  # one host: the NVLink-connected machines these chips come in
# The share of a GPU's memory a JAX process may use: JAX preallocates 75 % of it unless
# XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise (JAX's docs, "GPU memory allocation").
DEFAULT_MEM_FRACTION = 0.75
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")  # either registers "cuda"
INSTALL = "pip install -e '.[cuda-aot]'"


@dataclasses.dataclass(frozen=True)
class Target:
  """Compile-only devices and what each may hold."""

  name: str
  devices: list
  platform: str  # the devices' own ("tpu", "gpu"): what a run on them would resolve
  hbm_bytes: int  # what one device's program may use
  hbm_source: str  # where hbm_bytes comes from
  device_memory_bytes: int  # the device's whole memory


def names() -> list[str]:
  return [*TPU, *(f"{g}-{n}" for g in GPU for n in (1, 2, 4, 8))]


def target(name: str) -> Target:
  """The compile-only devices of topology `name` ("v5e-8", "h100-8", ...)."""
  if name in TPU:
    return _tpu(name)
  gpu, _, count = name.partition("-")
  if gpu in GPU and count.isdigit() and 1 <= int(count) <= MAX_GPUS:
    return _gpu(gpu, int(count))
  raise InputError(
    f"--compile_topology {name!r}: unknown; use one of {', '.join(TPU)}, or h100-N or h200-N "
    f"(one host of N GPUs, 1 <= N <= {MAX_GPUS})"
  )


def _tpu(name: str) -> Target:
  t = TPU[name]
  try:
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
      platform="tpu",
      topology_name=t.topology_name,
      chip_config_name=t.chip_config_name,
      chips_per_host_bounds=t.chips_per_host_bounds,
      num_slices=1,
      wrap=(False, False, False),
    )
  except Exception as e:  # libtpu missing or incompatible
    raise InputError(
      f"--compile_topology {name}: cannot create TPU compile-only devices "
      f"({type(e).__name__}: {e}); install libtpu matching jax with "
      f'pip install -e ".[tpu]"'
    ) from e
  devices = list(desc.devices)
  hbm = int(t.hbm_bytes)
  return Target(name, devices, devices[0].platform, hbm, "the TPU compiler's HBM per device", hbm)


def spec_path(gpu: str) -> str:
  """The target spec file of GPU `gpu` ("h100", "h200")."""
  return str(resources.files("cdeit_jax") / "assets" / "gpu_targets" / GPU[gpu])


def spec_text(gpu: str) -> str:
  with open(spec_path(gpu)) as fh:
    return fh.read()


def spec_memory_bytes(text: str) -> int:
  """`gpu_device_info.device_memory_size` of a target spec: the one field read here (a regular
  expression: jaxlib exposes no Python class of the proto to parse it with)."""
  m = re.search(r"^\s*device_memory_size:\s*(\d+)\s*$", text, re.MULTILINE)
  if not m:
    raise InputError("GPU target spec: no gpu_device_info.device_memory_size")
  return int(m.group(1))


def mem_fraction() -> float:
  """The share of a GPU's memory a JAX process takes (XLA_PYTHON_CLIENT_MEM_FRACTION)."""
  text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
  try:
    return float(text) if text.strip() else DEFAULT_MEM_FRACTION
  except ValueError:
    raise InputError(
      f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r}: not a number (e.g. .75, JAX's default)"
    ) from None


def _plugin_versions() -> dict[str, str]:
  from importlib import metadata

  found = {}
  for dist in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt"):
    try:
      found[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
      pass
  return found


def cuda_plugin_installed() -> bool:
  """Whether JAX's CUDA plugin is installed (without importing it: a CPU run never loads it)."""

  def found(name: str) -> bool:
    try:
      return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
      return False

  return any(found(m) for m in CUDA_PLUGINS)


def _gpu(gpu: str, count: int) -> Target:
  """`count` compile-only GPUs of kind `gpu` on one host. JAX's backends are limited to the CPU
  for this process (`jax_platforms=cpu`): the CUDA plugin registers without a GPU then, where
  otherwise it calls cuInit at start-up, fails without a driver and does not register."""
  import jax
  import jaxlib

  name = f"{gpu}-{count}"
  if not cuda_plugin_installed():
    raise InputError(
      f"--compile_topology {name}: JAX's CUDA plugin is not installed; install it at this jax's "
      f"version with {INSTALL} (no GPU needed)"
    )
  jax.config.update("jax_platforms", "cpu")  # no effect where JAX's backends have started
  from jax.experimental import topologies

  text = spec_text(gpu)
  try:
    desc = topologies.get_topology_desc(
      platform="cuda", target_config=text, topology=f"1x1x{count}"
    )
  except NotImplementedError as e:  # the plugin did not register
    versions = _plugin_versions()
    if any(v != jaxlib.__version__ for v in versions.values()):
      why = f"its version is not jaxlib's {jaxlib.__version__} ({versions}): {INSTALL}"
    else:
      why = (
        "JAX started its backends before, without JAX_PLATFORMS=cpu, and the plugin failed "
        "without a GPU: run it in a fresh process, or with JAX_PLATFORMS=cpu"
      )
    raise InputError(
      f"--compile_topology {name}: JAX's CUDA plugin is not registered in this process; {why}"
    ) from e
  except Exception as e:
    if "GpuTargetConfigProto" not in str(e):
      raise
    raise InputError(
      f"--compile_topology {name}: {spec_path(gpu)} does not parse with jaxlib "
      f"{jaxlib.__version__} (its GpuTargetConfigProto differs from jaxlib 0.10.2's, which the "
      "shipped specs match; the line XLA logged above names the field): install jax==0.10.2, "
      "or take the spec that matches this jaxlib's XLA commit (cdeit_jax/assets/gpu_targets/"
      "README.md)"
    ) from e
  devices = list(desc.devices)
  total = spec_memory_bytes(text)
  frac = mem_fraction()
  source = f"{GPU[gpu]}'s device_memory_size x {frac} (XLA_PYTHON_CLIENT_MEM_FRACTION)"
  return Target(name, devices, devices[0].platform, int(total * frac), source, total)
