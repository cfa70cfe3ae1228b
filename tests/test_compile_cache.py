"""JAX's persistent compilation cache for the commands (`cdeit_jax.common.compile_cache`):
damaged entries are replaced, and a cache that cannot be used never stops a command."""

import os
import subprocess
import sys
import time

_JIT = """
import sys, warnings
warnings.simplefilter("always")
from cdeit_jax.common import compile_cache, logs
logs.console()
compile_cache.enable(sys.argv[1])
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.sin(x) * 3)(jnp.float32(1.0)).block_until_ready()
print("hits", compile_cache.hits())
"""


def test_damaged_cache_entries_are_replaced(tmp_path):
  """A truncated entry (a writer killed) and one with a changed byte are removed at the next
  start, written again by that run, and loaded by the one after: no run after the damage sees
  JAX's read error."""
  import os
  import subprocess
  import sys
  import time

  script, cache = tmp_path / "jit.py", tmp_path / "cache"
  script.write_text(_JIT)

  def run() -> tuple[int, str]:
    p = subprocess.run(
      [sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return int(p.stdout.split()[-1]), p.stderr

  assert run()[0] == 0  # two programs (the lambda, the float32 conversion) compiled and written
  entries = sorted(cache.glob("*-cache"))
  assert len(entries) == 2, entries
  whole = {e.name: e.read_bytes() for e in entries}
  first, second = entries
  first.write_bytes(whole[first.name][: len(whole[first.name]) // 2])
  changed = bytearray(whole[second.name])
  changed[len(changed) // 2] ^= 0xFF
  second.write_bytes(bytes(changed))
  old = time.time() - 120  # settled: not an entry another process may still be writing
  for e in entries:
    os.utime(e, (old, old))
  hits, err = run()
  assert "removed 2 damaged entries" in err and first.name in err, err
  assert "Error reading persistent compilation cache" not in err, err
  assert hits == 0 and {e.name: e.read_bytes() for e in entries} == whole
  hits, err = run()
  assert hits == 2 and "damaged" not in err and "Error reading" not in err, err


def test_a_broken_cache_never_stops_a_command(tmp_path):
  """A cache that is a file, or lies under a file, is one warning line and the command runs
  without it; a folder of the cache holding a folder named like an entry, a link loop named
  like one and a folder named like an access-time file beside a damaged entry runs with it."""
  script = tmp_path / "jit.py"
  script.write_text(_JIT)
  (tmp_path / "file").write_text("")
  odd = tmp_path / "odd"
  (odd / "x-cache").mkdir(parents=True)
  (odd / "loop-cache").symlink_to(odd / "loop-cache")
  (odd / "y-cache").write_bytes(b"damaged")
  (odd / "y-atime").mkdir()
  old = time.time() - 120
  os.utime(odd / "y-cache", (old, old))
  for cache, used in ((tmp_path / "file", False), (tmp_path / "file" / "sub", False), (odd, True)):
    p = subprocess.run(
      [sys.executable, "-W", "error::UserWarning", str(script), str(cache)],
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    warned = [line for line in p.stderr.splitlines() if "running without it" in line]
    assert len(warned) == (0 if used else 1), p.stderr
    if not used:
      assert f"compilation cache {cache}: not " in warned[0]
  assert (
    (odd / "x-cache").is_dir() and (odd / "y-atime").is_dir() and (odd / "loop-cache").is_symlink()
  )
