"""Compile-only devices of named topologies: the GPU target specs that ship in
cdeit_jax/assets/gpu_targets parse with this jaxlib (through JAX's CUDA plugin, no GPU), a spec
it cannot parse and a missing plugin are one line each, unknown names are refused."""

import os
import re
import subprocess
import sys

import pytest

from cdeit_jax.common import topologies
from cdeit_jax.common.errors import InputError

needs_cuda_plugin = pytest.mark.skipif(
  not topologies.cuda_plugin_installed(),
  reason="JAX's CUDA plugin is not installed (pip install -e '.[cuda-aot]'); .ci/run installs it",
)
# what each spec's own text says of the chip (its model string and name), read here by hand
CHIPS = {
  "h100": ("NVIDIA H100 80GB HBM3", 84942979072),
  "h200": ("NVIDIA H200 141GB HBM3e", 151397597184),
}


@pytest.mark.parametrize("gpu", sorted(topologies.GPU))
def test_each_spec_names_its_source_licence_and_change(gpu):
  text = topologies.spec_text(gpu)
  assert 'Licensed under the Apache License, Version 2.0 (the "License")' in text
  source = r"openxla/xla's xla/backends/gpu/target_config/specs/\S+ at\n# commit [0-9a-f]{40}"
  assert re.search(source, text)
  assert not re.search(r"^\s*collective_memory_granularity:", text, re.MULTILINE)
  name, memory = CHIPS[gpu]
  assert f'name: "{name}"' in text and f"with {memory}B RAM" in text
  assert topologies.spec_memory_bytes(text) == memory
  readme = os.path.join(os.path.dirname(topologies.spec_path(gpu)), "README.md")
  assert topologies.GPU[gpu] in open(readme).read()


@needs_cuda_plugin
@pytest.mark.parametrize("gpu", sorted(topologies.GPU))
def test_the_shipped_specs_parse_into_compile_only_gpus(gpu, monkeypatch):
  """jaxlib's own parser (in the CUDA plugin) reads the spec: the devices carry its name, and the
  memory a JAX process may use is JAX's default 75 % of the spec's (or the fraction set)."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  name, memory = CHIPS[gpu]
  t = topologies.target(f"{gpu}-4")
  assert len(t.devices) == 4 and {d.process_index for d in t.devices} == {0}
  assert {d.device_kind for d in t.devices} == {name} and t.platform == "gpu"
  assert t.device_memory_bytes == memory and t.hbm_bytes == int(memory * 0.75)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
  assert topologies.target(f"{gpu}-1").hbm_bytes == int(memory * 0.9)


@needs_cuda_plugin
def test_a_spec_this_jaxlib_cannot_parse_is_one_line(tmp_path, monkeypatch):
  """The newest upstream spec's field that jaxlib 0.10.2's proto lacks, put back."""
  text = topologies.spec_text("h100").replace(
    "  device_interconnect_info {",
    "  collective_memory_granularity: 2097152\n  device_interconnect_info {",
  )
  (tmp_path / "h100_sxm.txtpb").write_text(text)
  monkeypatch.setattr(topologies, "spec_path", lambda gpu: str(tmp_path / topologies.GPU[gpu]))
  with pytest.raises(InputError, match=r"h100_sxm.txtpb does not parse with jaxlib [\d.]+ ") as e:
    topologies.target("h100-1")
  assert "\n" not in str(e.value) and "README.md" in str(e.value)


@needs_cuda_plugin
def test_a_process_whose_jax_started_on_its_own_is_told_what_to_do():
  """JAX's backends started without JAX_PLATFORMS=cpu (the plugin then fails without a GPU and
  does not register): one line saying to run in a fresh process or with JAX_PLATFORMS=cpu."""
  code = (
    "import jax; jax.devices()\n"
    "from cdeit_jax.common import topologies\n"
    "try:\n  topologies.target('h100-1')\n"
    "except topologies.InputError as e:\n  print('ERROR', e)\n"
  )
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  line = [ln for ln in r.stdout.splitlines() if ln.startswith("ERROR")]
  assert len(line) == 1, r.stdout + r.stderr[-2000:]
  assert "CUDA plugin is not registered in this process" in line[0]
  assert "run it in a fresh process, or with JAX_PLATFORMS=cpu" in line[0]


def test_without_the_plugin_the_install_is_named(monkeypatch):
  monkeypatch.setattr(topologies, "cuda_plugin_installed", lambda: False)
  with pytest.raises(InputError, match=r"CUDA plugin is not installed.*'\.\[cuda-aot\]'"):
    topologies.target("h200-1")


@pytest.mark.parametrize("name", ["v9-8", "h100-9", "h100-0", "h100", "a100-1", "h100-x"])
def test_unknown_topologies_are_named(name):
  with pytest.raises(InputError, match=f"--compile_topology '{name}': unknown; use one of v4-8"):
    topologies.target(name)
  assert "h100-8" in topologies.names() and "v5e-8" in topologies.names()


def test_a_bad_memory_fraction_is_named(monkeypatch):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "most")
  with pytest.raises(InputError, match="XLA_PYTHON_CLIENT_MEM_FRACTION='most': not a number"):
    topologies.mem_fraction()
