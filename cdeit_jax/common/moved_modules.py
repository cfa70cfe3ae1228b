"""Modules of the flat layout (cdeit-jax 0.1) and where they live now. Importing an old path (a
user's config file or script) fails with one line that names the new one: `install` adds a finder
consulted after every other. `cdeit_jax.model` and `cdeit_jax.data` are packages now; they still
give the names of the modules they replaced (PEP 562)."""

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
  "cdeit_jax.aot": "cdeit_jax.train.aot",
  "cdeit_jax.attention": "cdeit_jax.model.attention",
  "cdeit_jax.checkpoint": "cdeit_jax.checkpoints.checkpoint",
  "cdeit_jax.compile_cache": "cdeit_jax.common.compile_cache",
  "cdeit_jax.conditioning": "cdeit_jax.eit.conditioning",
  "cdeit_jax.cpu_tuning": "cdeit_jax.common.cpu_tuning",
  "cdeit_jax.device_memory": "cdeit_jax.common.device_memory",
  "cdeit_jax.diffusion": "cdeit_jax.model.diffusion",
  "cdeit_jax.eit.reconstruct": "cdeit_jax.eit.tikhonov",
  "cdeit_jax.errors": "cdeit_jax.common.errors",
  "cdeit_jax.evaluate": "cdeit_jax.infer.evaluate",
  "cdeit_jax.fileio": "cdeit_jax.common.fileio",
  "cdeit_jax.files": "cdeit_jax.data.npz_files",
  "cdeit_jax.flops": "cdeit_jax.model.flops",
  "cdeit_jax.frames": "cdeit_jax.infer.frames",
  "cdeit_jax.goodput": "cdeit_jax.train.goodput",
  "cdeit_jax.hardware": "cdeit_jax.common.hardware",
  "cdeit_jax.logs": "cdeit_jax.common.logs",
  "cdeit_jax.matfile": "cdeit_jax.common.matfile",
  "cdeit_jax.measurement": "cdeit_jax.eit.measurement",
  "cdeit_jax.metrics": "cdeit_jax.infer.metrics",
  "cdeit_jax.models": "cdeit_jax.checkpoints.loading",
  "cdeit_jax.outputs": "cdeit_jax.infer.outputs",
  "cdeit_jax.pipeline": "cdeit_jax.data.pipeline",
  "cdeit_jax.protocol": "cdeit_jax.eit.measurement",
  "cdeit_jax.reconstructor": "cdeit_jax.infer.reconstructor",
  "cdeit_jax.sampling": "cdeit_jax.infer.sampling",
  "cdeit_jax.sharding": "cdeit_jax.common.sharding",
  "cdeit_jax.simulator_source": "cdeit_jax.data.simulator_source",
  "cdeit_jax.sources": "cdeit_jax.data.training_data",
  "cdeit_jax.stats": "cdeit_jax.data.stats",
  "cdeit_jax.symmetry": "cdeit_jax.eit.symmetry",
  "cdeit_jax.synthetic": "cdeit_jax.data.synthetic",
  "cdeit_jax.train_loop": "cdeit_jax.train.train_loop",
  "cdeit_jax.trainer": "cdeit_jax.train.train_loop",
  "cdeit_jax.training": "cdeit_jax.train.training",
  "cdeit_jax.variables": "cdeit_jax.common.variables",
  "cdeit_jax.workdir_lock": "cdeit_jax.train.workdir_lock",
}


def moved_message(old: str) -> str:
  return (
    f"{old} moved to {MOVED[old]} when cdeit-jax's modules went into subpackages "
    "(docs/architecture.md): change the import"
  )


def command_moved(name: str, command: str) -> None:
  """Called at the end of a library module whose command moved to the top layer (`command`): run
  as `python -m` (its `name` the main module's), it stops with one line naming the command."""
  if name == "__main__":
    print(
      f"error: this command is `python -m {command}` now (commands live in the top layer, "
      "docs/architecture.md)",
      file=sys.stderr,
    )
    sys.exit(2)


class MovedModuleError(ModuleNotFoundError):
  """Importing a module of the flat layout (`moved_from`). Its `name` is not the module's, so
  that `from cdeit_jax import evaluate` reports it too (the import system passes over a missing
  submodule of that very name and then looks for an attribute, losing the message)."""

  def __init__(self, old: str):
    super().__init__(moved_message(old))
    self.moved_from = old


def _asked_by_util_find_spec() -> bool:
  """Whether `importlib.util.find_spec` (which should answer None for a module that is not
  there), not an import statement, asks the finder: util.find_spec -> _find_spec -> finder."""
  frame = sys._getframe(3)
  return frame is not None and frame.f_code is importlib.util.find_spec.__code__


class _MovedModules(importlib.abc.MetaPathFinder):
  """Consulted after every other finder: importing an old module path fails with
  `moved_message`; `importlib.util.find_spec` of it answers None (it is not there)."""

  def find_spec(self, name, path=None, target=None):
    if name in MOVED and not _asked_by_util_find_spec():
      raise MovedModuleError(name)
    return None


def install() -> None:
  if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def names_of(package: str, module: str):
  """A package's `__getattr__` (PEP 562) that gives the names of `module`, the module the package
  replaced (`from cdeit_jax.model import CDEIT`); its own submodules load as usual."""

  def __getattr__(name: str):
    if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is None:
      try:
        return getattr(importlib.import_module(module), name)
      except AttributeError:
        pass
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  return __getattr__
