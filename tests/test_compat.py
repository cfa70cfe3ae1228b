"""Each rule of `compat` (where we read other libraries' error text) against the library's own
error, provoked for real: XLA allocations and TPU compiles that do not fit, TensorStore reading
a damaged checkpoint and writing to a full disk (a 256 KiB tmpfs), a closed asyncio loop."""

import asyncio
import errno
import os
import pathlib
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from cdeit_jax.common import compat


def _raised(fn) -> BaseException:
  try:
    fn()
  except Exception as e:  # the library's own type, whatever it is
    return e
  raise AssertionError(f"{fn} raised nothing")


def test_xla_out_of_memory_on_the_host():
  """XLA:CPU refusing a 32 TiB buffer is out of memory, with no compiler figure; an ordinary
  error is not."""
  e = _raised(lambda: jax.jit(lambda: jnp.zeros((1 << 43,), jnp.float32))().block_until_ready())
  assert compat.is_out_of_memory(e) and compat.required_bytes(e) is None
  other = _raised(lambda: jnp.ones(3) @ jnp.ones(4))
  assert not compat.is_out_of_memory(other) and compat.required_bytes(other) is None


def test_tpu_compiler_out_of_memory_and_its_figure():
  """A compile-only v5e chip (15.75 GiB of HBM) refusing x @ x.T of a 16 GiB x: out of memory,
  with a figure above the chip's memory (it did not fit) and below the 64 GiB product."""
  pytest.importorskip("libtpu")
  from cdeit_jax.common import topologies

  try:
    devices = topologies.target("v5e-8").devices
  except Exception as e:  # libtpu without compile-only support here
    pytest.skip(f"no compile-only TPU devices: {e}")
  mesh = jax.sharding.Mesh(np.array(devices[:1]), ("d",))
  s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  f = jax.jit(lambda x: (x @ x.T).sum(), in_shardings=s, out_shardings=s)
  e = _raised(
    lambda: f.lower(jax.ShapeDtypeStruct((1 << 17, 1 << 15), jnp.float32, sharding=s)).compile()
  )
  assert compat.is_out_of_memory(e)
  need = compat.required_bytes(e)
  assert need is not None and 15.75 * 2**30 < need <= 64 * 2**30, (need, str(e)[:300])


def test_tensorstore_names_the_array_the_file_and_the_reason(tmp_path):
  """A checkpoint whose chunk files were emptied: the array is `w`, the file one of the emptied
  ones, the reason TensorStore's innermost."""
  d = tmp_path / "ck"
  with ocp.StandardCheckpointer() as c:
    c.save(d, {"w": np.arange(4096, dtype=np.float32)})
  emptied = [f for f in d.rglob("*") if f.is_file() and f.parent.name == "d"]
  for f in emptied:
    f.write_bytes(b"")

  def restore():
    with ocp.StandardCheckpointer() as c:
      c.restore(d, {"w": jax.ShapeDtypeStruct((4096,), np.float32)})

  array, file, reason = compat.tensorstore_failure(_raised(restore))
  assert array == "w"
  assert pathlib.Path(file) in emptied
  assert "size 0" in reason and len(reason) <= 203


@pytest.fixture
def full_disk(tmp_path):
  """A 256 KiB tmpfs (needs root and mount; skipped elsewhere)."""
  m = tmp_path / "full"
  m.mkdir()
  r = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(m)], capture_output=True, text=True
  )
  if r.returncode:
    pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
  yield m
  subprocess.run(["umount", str(m)], check=True)


def test_a_full_disk_as_the_system_and_as_tensorstore_say_it(full_disk):
  """ENOSPC from the kernel (an OSError), and TensorStore's text of the same under orbax's
  save (a ValueError whose text carries the C library's strerror)."""
  assert compat.NO_SPACE == os.strerror(errno.ENOSPC)

  def write():
    (full_disk / "big").write_bytes(b"\0" * (1 << 20))

  e = _raised(write)
  assert isinstance(e, OSError) and e.errno == errno.ENOSPC and compat.is_disk_full(e)

  def save():
    with ocp.StandardCheckpointer() as c:
      c.save(full_disk / "ck", {"w": np.random.rand(1 << 20).astype(np.float32)})

  (full_disk / "big").unlink(missing_ok=True)
  e = _raised(save)
  assert not isinstance(e, OSError) and compat.is_disk_full(e)
  assert not compat.is_disk_full(ValueError("RESOURCE_EXHAUSTED: Out of memory allocating"))


def test_a_closed_event_loop():
  loop = asyncio.new_event_loop()
  loop.close()
  e = _raised(lambda: loop.call_soon(lambda: None))
  assert compat.is_closed_loop(e)
  assert not compat.is_closed_loop(RuntimeError("Event loop is running"))
