"""Sciospec EIT recordings, the vendor's own files: a recording folder (`<date time>/`, holding
`setup/`), its `setup/` subfolder of frame files (`setup_00001.eit`, ...), or one `.eit` file,
read as the named arrays of a device file and a frames file (registered in `common.array_files`;
docs/your_device.md, "Sciospec").

A frame file: line 1 the number of header lines (9: the first version's; 11 or more: a version
line follows), then name, date, frequencies (minimum, maximum, log scale, count), amplitude,
frame rate, [phase correction, gain, ADC range, measure mode, boundary, switch type] and keyed
lines (`MeasurementChannels: 1,...,16`, `MeasurementChannelsIndependentFromInjectionPattern:
...`); then for each injection a line of its two electrodes (`1 2`: current in at 1, out at 2)
and one line per frequency of the channels' voltages against ground, real and imaginary parts
alternating, the measurement channels first.

The device's values are differential, adjacent: `V_c[j] - V_c[j+1]` over the measurement channels
`c` in their order (the last against the first), for every injection: 16 pairs x 16 injections =
256 values for 16 electrodes, pattern by pattern, all pairs kept (the model's 208 are made from
them by `make device-model`'s translation). Of the complex differences the real (in-phase) part
is taken by default (`PART`). Its empty tank is the mean of a range of its frames (`REFERENCE`).

Settings, from the environment (read when a recording is read; the same for every command):
  CDEIT_SCIOSPEC_FREQUENCY  which frequency, from 1 (default 1, the first)
  CDEIT_SCIOSPEC_REFERENCE  the frames averaged as the empty tank: the files' numbers, "1-20"
                            (default: the first 20 frames, or all of a shorter recording)
  CDEIT_SCIOSPEC_PART       real (default) or magnitude (|V|, with the real part's sign)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

import numpy as np

from cdeit_jax.common.errors import InputError, MissingFile

FREQUENCY, REFERENCE, PART = (
  "CDEIT_SCIOSPEC_FREQUENCY",
  "CDEIT_SCIOSPEC_REFERENCE",
  "CDEIT_SCIOSPEC_PART",
)
PARTS = ("real", "magnitude")
REFERENCE_FRAMES = 20  # the default empty tank: the first 20 frames
# the arrays given (`eit.device_files` registers the format "Sciospec" by these keys)
CURRENTS, PAIRS, EMPTY, NAME = (
  "sciospec_currents",
  "sciospec_pairs",
  "sciospec_empty",
  "device_name",
)
EMPTY_ROWS = "sciospec_empty_rows"  # the frames averaged as the empty tank: rows, from 0
FRAME_NAME = re.compile(r"^(.*)_(\d+)\.eit$", re.IGNORECASE)
SINGLE_ENDED = 1  # the measure mode this reader knows: each channel against ground


@dataclasses.dataclass(frozen=True)
class Frame:
  """One `.eit` file as read: its header's fields, injections (P, 2) and voltages (P, F, C)."""

  path: str
  header: dict
  injections: np.ndarray  # (P, 2) int: electrode in, electrode out (from 1)
  voltages: np.ndarray  # (P, F, C) complex: each channel against ground


def _fail(path: str, line: int | None, why: str) -> InputError:
  where = f"{path}: line {line}: " if line is not None else f"{path}: "
  return InputError(f"{where}{why}; not a readable Sciospec frame file (.eit)")


def _number(path: str, line: int, text: str, kind=float):
  try:
    value = kind(text.strip())
  except ValueError:
    raise _fail(path, line, f"{text.strip()[:40]!r} is not a number") from None
  if kind is float and not np.isfinite(value):
    raise _fail(path, line, f"{text.strip()[:40]!r} is not a finite number")
  return value


def _channels(path: str, line: int, text: str) -> tuple[int, ...]:
  fields = [f for f in text.replace(",", " ").split() if f]
  return tuple(_number(path, line, f, int) for f in fields)


def read_frame(path: str) -> Frame:
  """One `.eit` file, every line checked: a damaged file (empty, cut short, letters among the
  numbers, an injection without its voltages) is refused in one line naming it and the line."""
  try:
    with open(path, "rb") as fh:
      data = fh.read()
  except FileNotFoundError:
    raise MissingFile(f"{path}: no such Sciospec frame file") from None
  if not data.strip():
    raise _fail(path, None, f"empty ({len(data)} bytes)")
  lines = data.decode("utf-8", errors="replace").splitlines()
  count = _number(path, 1, lines[0], int)
  if count < 9 or count == 10:
    raise _fail(path, 1, f"{count} header lines; the format has 9 (version 1) or 11 or more")
  if len(lines) < count:
    raise _fail(path, len(lines), f"the file ends inside its {count}-line header")
  head = lines[:count]
  at = 1  # the next header line (from 0)
  header: dict = {"header_lines": count, "version": 1}
  if count >= 11:
    header["version"] = _number(path, 2, head[1], int)
    at = 2
  header["name"], header["date"] = head[at].strip(), head[at + 1].strip()
  at += 2
  for key in ("min_frequency", "max_frequency", "log_scale", "num_frequencies", "amplitude"):
    header[key] = _number(path, at + 1, head[at])
    at += 1
  header["frame_rate"] = _number(path, at + 1, head[at])
  at += 1
  # the rest by position while numbers, then by key (a shorter header simply lacks some)
  positional = ["phase_correction", "gain", "adc_range", "measure_mode", "boundary", "switch"]
  if count < 11:
    positional = []
  for i in range(at, count):
    text = head[i]
    key, colon, rest = text.partition(":")
    if colon:
      header[key.strip()] = _channels(path, i + 1, rest)
    elif positional:
      header[positional.pop(0)] = _number(path, i + 1, text)
  freqs = header["num_frequencies"]
  if freqs != int(freqs) or freqs < 1:
    raise _fail(path, at - 2, f"frequency count {freqs:g}: must be a whole number >= 1")
  freqs = int(freqs)
  header["num_frequencies"] = freqs
  mode = header.get("measure_mode", SINGLE_ENDED)
  if mode != SINGLE_ENDED:
    raise InputError(
      f"{path}: measure mode {mode:g} (2: differential at the device); this reader knows "
      f"measure mode {SINGLE_ENDED} (each channel against ground) only"
    )
  body = lines[count:]
  while body and not body[-1].strip():
    body.pop()
  if not body:
    raise _fail(path, count, "no injections after the header")
  independent = header.get("MeasurementChannelsIndependentFromInjectionPattern")
  width = 2 * len(independent) if independent else None
  group = 1 + freqs
  if len(body) % group:
    last = count + len(body)
    raise _fail(
      path,
      last,
      f"the file ends inside an injection ({len(body) % group} of its {group} lines: its "
      f"electrodes and {freqs} line(s) of voltages)",
    )
  injections, voltages = [], []
  for g in range(0, len(body), group):
    n = count + g + 1  # the injection's line number, from 1
    pair = body[g].split()
    if len(pair) != 2:
      raise _fail(path, n, f"{body[g].strip()[:40]!r} is not an injection's two electrodes")
    injections.append([_number(path, n, p, int) for p in pair])
    rows = []
    for f in range(freqs):
      text, line = body[g + 1 + f], n + 1 + f
      try:
        values = np.array(text.split(), np.float64)
      except ValueError:
        bad = next(x for x in text.split() if not _is_float(x))
        raise _fail(path, line, f"{bad[:40]!r} is not a number") from None
      if not np.isfinite(values).all():
        raise _fail(path, line, "NaN or infinite voltages")
      width = len(values) if width is None else width
      if len(values) != width or width % 2 or width == 0:
        raise _fail(
          path, line, f"{len(values)} numbers; a line of voltages holds {width} (real and "
          "imaginary parts of every channel): the line is cut short or the file damaged"
        )  # fmt: skip
      rows.append(values[0::2] + 1j * values[1::2])
    voltages.append(rows)
  return Frame(path, header, np.asarray(injections, np.int64), np.asarray(voltages))


def _is_float(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True


# ----------------------------------------------------------------------------- a recording


def frame_files(path: str) -> tuple[str, list[str]]:
  """(the folder of frame files, their paths in frame order) of a recording folder, its `setup/`
  subfolder or one `.eit` file; a gap in the frame numbers, mixed names or no frames are
  refused in one line."""
  if os.path.isfile(path):
    return os.path.dirname(path) or ".", [path]
  folder = _frames_folder(path)
  if folder is None:
    raise MissingFile(f"{path}: no Sciospec frame files (.eit) in it or in one subfolder")
  names = [n for n in os.listdir(folder) if n.lower().endswith(".eit")]
  numbered = [FRAME_NAME.match(n) for n in names]
  if not all(numbered):
    odd = [n for n, m in zip(names, numbered) if not m][0]
    raise InputError(f"{folder}: {odd} is not named NAME_NUMBER.eit as a recording's frames are")
  prefixes = sorted({m.group(1) for m in numbered})
  if len(prefixes) > 1:
    raise InputError(
      f"{folder}: frames of several recordings ({', '.join(prefixes[:3])}); keep one in a folder"
    )
  order = sorted(numbered, key=lambda m: int(m.group(2)))
  numbers = [int(m.group(2)) for m in order]
  jumps = [i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1]
  if jumps:
    i = jumps[0]
    missing = numbers[i] - numbers[i - 1] - 1
    raise InputError(
      f"{folder}: a gap in the frames: after {order[i - 1].group(0)} comes "
      f"{order[i].group(0)} ({missing} frame(s) missing{' or repeated' if missing < 0 else ''}"
      f"; {len(jumps)} gap(s) in all); a recording is read whole: restore the frames, or copy "
      "the frames you want into a folder of their own"
    )
  return folder, [os.path.join(folder, m.group(0)) for m in order]


def _frames_folder(path: str) -> str | None:
  if not os.path.isdir(path):
    return None
  if any(n.lower().endswith(".eit") for n in os.listdir(path)):
    return path
  subs = [os.path.join(path, n) for n in sorted(os.listdir(path))]
  subs = [
    s for s in subs if os.path.isdir(s) and any(n.lower().endswith(".eit") for n in os.listdir(s))
  ]
  return subs[0] if len(subs) == 1 else None


def claims(path: str) -> bool:
  """Whether `path` is a Sciospec recording: an `.eit` file, or a folder of them (or one whose
  one subfolder holds them)."""
  path = str(path)
  if "://" in path:
    return False
  if path.lower().endswith(".eit"):
    return True
  return _frames_folder(path) is not None


@dataclasses.dataclass(frozen=True)
class Settings:
  """The environment's settings (module docstring)."""

  frequency: int  # from 1
  reference: tuple[int, int] | None  # the files' numbers, inclusive; None: the default
  part: str

  @classmethod
  def from_env(cls) -> Settings:
    text = os.environ.get(FREQUENCY, "1").strip()
    if not text.isdigit() or int(text) < 1:
      raise InputError(f"{FREQUENCY}={text!r}: give the frequency's number, from 1 (the first)")
    ref = os.environ.get(REFERENCE, "").strip()
    span = None
    if ref:
      got = re.fullmatch(r"(\d+)\s*(?:-\s*(\d+))?", ref)
      if not got or int(got.group(2) or got.group(1)) < int(got.group(1)):
        raise InputError(
          f"{REFERENCE}={ref!r}: give the empty tank's frames as the files' numbers, e.g. 1-20"
        )
      span = (int(got.group(1)), int(got.group(2) or got.group(1)))
    part = os.environ.get(PART, PARTS[0]).strip().lower()
    if part not in PARTS:
      raise InputError(f"{PART}={part!r}: give one of {', '.join(PARTS)}")
    return cls(int(text), span, part)


def read(path: str) -> dict[str, np.ndarray]:
  """The recording at `path` as named arrays: `frames` (N, P x M) the device's differential
  values, pattern by pattern; `sciospec_currents` (E, P), `sciospec_pairs` (E, M) (+1/-1 each),
  `sciospec_empty` (P x M,) the empty tank (the mean of the reference frames, rows
  `sciospec_empty_rows` from 0), `device_name` (which says which frames, by the files' numbers)."""
  path = str(path).rstrip("/\\") or str(path)
  folder, files = frame_files(path)
  stamp = tuple((f, os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)
  return dict(_read(path, stamp, Settings.from_env()))


@functools.lru_cache(maxsize=4)
def _read(path: str, stamp: tuple, settings: Settings) -> dict:
  files = [f for f, _, _ in stamp]
  frames = [read_frame(f) for f in files]
  # the frames are compared with the first of the most common setup (a damaged first frame is
  # then the one named)
  kinds = [(f.injections.tobytes(), f.injections.shape, f.voltages.shape) for f in frames]
  first = frames[kinds.index(max(set(kinds), key=kinds.count))]
  _same(first, frames)
  head = first.header
  freqs = head["num_frequencies"]
  if settings.frequency > freqs:
    raise InputError(
      f"{FREQUENCY}={settings.frequency}: {first.path} holds {freqs} frequenc"
      f"{'y' if freqs == 1 else 'ies'}; give 1 to {freqs}"
    )
  inj = first.injections
  num_e = int(inj.max())
  channels = head.get("MeasurementChannels") or tuple(range(1, num_e + 1))
  num_e = max(num_e, max(channels))
  if int(inj.min()) < 1 or min(channels) < 1:
    raise InputError(f"{first.path}: electrode numbers count from 1; it holds 0 or less")
  if len(channels) > first.voltages.shape[2]:
    raise InputError(
      f"{first.path}: {len(channels)} measurement channels, but its lines hold "
      f"{first.voltages.shape[2]} channels' voltages"
    )
  _check_setup(path, files[0], inj)
  k = len(channels)
  nxt = np.roll(np.arange(k), -1)
  v = np.stack([f.voltages[:, settings.frequency - 1, :k] for f in frames])  # (N, P, K)
  diff = v - v[:, :, nxt]
  values = diff.real if settings.part == "real" else np.abs(diff) * np.sign(diff.real)
  values = values.reshape(len(frames), -1)
  currents = np.zeros((num_e, len(inj)))
  currents[inj[:, 0] - 1, np.arange(len(inj))] = 1.0  # current in at the first electrode
  currents[inj[:, 1] - 1, np.arange(len(inj))] = -1.0
  pairs = np.zeros((num_e, k))
  pairs[np.asarray(channels) - 1, np.arange(k)] = 1.0
  pairs[np.asarray(channels)[nxt] - 1, np.arange(k)] = -1.0
  numbers = [_file_number(f) for f in files]
  lo, hi = _reference_span(path, numbers, settings.reference)
  pick = [i for i, n in enumerate(numbers) if lo <= n <= hi]
  empty = values[pick].mean(axis=0)
  names = os.path.basename(files[pick[0]]), os.path.basename(files[pick[-1]])
  used = f"frame {lo}" if lo == hi else f"frames {lo}-{hi}"
  frequency = np.linspace(head["min_frequency"], head["max_frequency"], freqs)
  if head["log_scale"] and freqs > 1:
    frequency = np.geomspace(head["min_frequency"], head["max_frequency"], freqs)
  name = (
    f"{os.path.basename(path)} (Sciospec, {frequency[settings.frequency - 1]:g} Hz, "
    f"{settings.part} part; empty tank: the mean of {used}, "
    f"{names[0]}{' to ' + names[1] if len(pick) > 1 else ''})"
  )
  out = {
    "frames": values,
    CURRENTS: currents,
    PAIRS: pairs,
    EMPTY: empty,
    EMPTY_ROWS: np.asarray(pick, np.int64),
    NAME: np.array(name),
  }
  for a in out.values():  # shared by the callers of the cache
    a.flags.writeable = False
  return out


def _file_number(path: str) -> int:
  got = FRAME_NAME.match(os.path.basename(path))
  return int(got.group(2)) if got else 1


def _reference_span(path: str, numbers: list[int], span) -> tuple[int, int]:
  if span is None:
    return numbers[0], numbers[min(REFERENCE_FRAMES, len(numbers)) - 1]
  lo, hi = span
  if lo < numbers[0] or hi > numbers[-1]:
    raise InputError(
      f"{REFERENCE}={lo}-{hi}: {path} holds frames {numbers[0]}-{numbers[-1]}; give a range "
      "of them (the files' numbers)"
    )
  return lo, hi


_COMPARED = (
  "header_lines",
  "version",
  "min_frequency",
  "max_frequency",
  "log_scale",
  "num_frequencies",
  "amplitude",
  "measure_mode",
  "MeasurementChannels",
  "MeasurementChannelsIndependentFromInjectionPattern",
)


def _same(first: Frame, frames: list[Frame]) -> None:
  """Refuse frames whose injections, channels or header differ from `first`'s, naming them."""
  odd: dict[str, list[str]] = {}
  for f in frames:
    why, name = None, os.path.basename(f.path)
    if not np.array_equal(f.injections, first.injections):
      why, name = "injections", f"{name} ({len(f.injections)})"
    elif f.voltages.shape != first.voltages.shape:
      why = "channel count"
    else:
      keys = [k for k in _COMPARED if f.header.get(k) != first.header.get(k)]
      why = f"header ({', '.join(keys)})" if keys else None
    if why:
      odd.setdefault(why, []).append(name)
  if odd:
    why, names = next(iter(odd.items()))
    total = sum(len(v) for v in odd.values())
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    raise InputError(
      f"{os.path.dirname(first.path)}: {total} frame file(s) differ from the others "
      f"({os.path.basename(first.path)}, {len(first.injections)} injections) in their {why}: "
      f"{shown}; a recording's frames are all of one setup: move them out (or repair them)"
    )


def _check_setup(path: str, first_file: str, injections: np.ndarray) -> None:
  """The recording's `setup.setUp` (beside the frames' folder or in it), where there is one:
  its current excitation pattern must be the frames' injections."""
  here = os.path.dirname(first_file)
  for setup in (
    os.path.join(here, "setup.setUp"),
    os.path.join(os.path.dirname(here), "setup.setUp"),
  ):
    if os.path.isfile(setup):
      break
  else:
    return
  with open(setup, encoding="utf-8", errors="replace") as fh:
    lines = fh.read().splitlines()
  start = next((i for i, t in enumerate(lines) if t.startswith("CurrentExcitationPattern")), None)
  if start is None:
    return
  rows = []
  for text in lines[start + 1 :]:
    fields = [x.strip() for x in text.split(",") if x.strip()]
    if len(fields) < 2 or not all(x.lstrip("-").isdigit() for x in fields[:2]):
      break
    rows.append([int(fields[0]), int(fields[1])])
  if rows and not np.array_equal(np.asarray(rows), injections):
    raise InputError(
      f"{setup}: its CurrentExcitationPattern ({len(rows)} rows, first {rows[0]}) is not the "
      f"injections of {first_file} ({len(injections)}, first {injections[0].tolist()})"
    )
