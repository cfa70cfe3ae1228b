"""Where cdeit-jax reads other libraries' error text, in one place. Each rule is tested against
the library's own error, provoked for real (tests/test_compat.py: an XLA allocation and a TPU
compile that do not fit, a TensorStore read of a damaged checkpoint and a write to a full
tmpfs, a closed asyncio loop), so a library that changes its wording fails a test, not a user's
run.

- XLA: out of memory (`RESOURCE_EXHAUSTED`), and the compiler's "memory required for HLO
  temporaries (16.00G)" figure.
- TensorStore (under orbax): the array and the file a failed read names, and its innermost
  reason.
- The C library's ENOSPC text ("No space left on device"), which TensorStore passes on as text.
- asyncio's "Event loop is closed", which TensorStore's callbacks meet after orbax gave up a
  failed asynchronous save.
"""

from __future__ import annotations

import errno
import re

# --------------------------------------------------------------------------------------- XLA


def is_out_of_memory(e: BaseException) -> bool:
  """Whether XLA (a compile or an allocation) ran out of device memory."""
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text


def required_bytes(e: BaseException) -> int | None:
  """The compiler's 'memory required ... (25.07G)' figure of an out-of-memory error, if any."""
  m = re.search(r"required[^(]*\(([\d.]+)([KMGT])\)", str(e))
  if not m:
    return None
  return int(float(m.group(1)) * 1024 ** "KMGT".index(m.group(2)) * 1024)


# ------------------------------------------------------------------------------- TensorStore


def tensorstore_failure(e: BaseException) -> tuple[str | None, str | None, str]:
  """(array, file, reason) of a failed TensorStore read or write as orbax raises it: the array's
  path in the checkpoint item, the last file (or URL) it names, and the innermost reason (at most
  200 characters); None where the text names none."""
  text = " ".join(str(e).split(" [tensorstore_spec")[0].split())
  files = re.findall(r'local file "([^"]+)"', text) or re.findall(
    r"((?:[a-z][a-z0-9+.-]*://|/)[^\s\"']+)", text
  )  # a path or a URL
  array = re.search(r'Error reading "([^"]+?)/\.z', text)
  reason = text.rsplit(": ", 1)[-1] if "Error opening" in text else text
  if len(reason) > 200:
    reason = reason[:200] + "..."
  return (array.group(1) if array else None), (files[-1] if files else None), reason


# ------------------------------------------------------------------------- the C library


NO_SPACE = "No space left on device"  # strerror(ENOSPC), which libraries pass on as text


def is_disk_full(e: BaseException) -> bool:
  """Whether `e`, or an error it was raised from or during, is a full disk: an OSError with
  ENOSPC, or a library's error that carries the system's text (TensorStore, under orbax's
  asynchronous saves, reports it as text)."""
  seen = set()
  stack = [e]
  while stack:
    x = stack.pop()
    if x is None or id(x) in seen:
      continue
    seen.add(id(x))
    if (isinstance(x, OSError) and x.errno == errno.ENOSPC) or NO_SPACE in str(x):
      return True
    stack += [x.__cause__, x.__context__, *getattr(x, "exceptions", ())]
  return False


# ----------------------------------------------------------------------------------- asyncio


def is_closed_loop(e: BaseException) -> bool:
  """asyncio's error for a callback scheduled on a loop that is closed."""
  return isinstance(e, RuntimeError) and str(e) == "Event loop is closed"
