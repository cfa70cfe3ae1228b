"""Sciospec recordings (`cdeit_jax.common.sciospec`): small folders written here in the vendor's
format, their differential values computed by hand (the truth), header variants, refusals, the
reference range; and the shared real recording where it is present (`../shared`)."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from cdeit_jax.common import array_files, sciospec
from cdeit_jax.common.errors import InputError, MissingFile
from cdeit_jax.eit import layout
from cdeit_jax.infer import frames

E = 8  # electrodes of the small recordings
INJECTIONS = [(k + 1, (k + 1) % E + 1) for k in range(E)]  # adjacent: 1 2, 2 3, ..., 8 1


def header(kind: str, name: str, freqs: int = 1) -> list[str]:
  """A frame file's header lines: "v1" (9 lines), "v2short" (11 lines) or "full" (18 lines)."""
  common = [name, "2025.02.12. 13:19:58.685", "10000.0", "20000.0", "0", str(freqs), "0.005"]
  if kind == "v1":
    return ["9", *common, "20.0"]
  if kind == "v2short":
    return ["11", "2", *common, "20.0", "0.0"]
  channels = ",".join(str(c) for c in range(1, E + 1))
  indep = ",".join(str(c) for c in range(1, 2 * E + 1))
  return [
    "18", "2", *common, "20.0", "0.0", "1.0", "1", "1", "1", "1",
    f"MeasurementChannels: {channels}",
    f"MeasurementChannelsIndependentFromInjectionPattern: {indep}",
  ]  # fmt: skip


def write_frame(path, volts: np.ndarray, kind: str = "full", injections=INJECTIONS) -> None:
  """volts (P, F, 2E) complex: every channel's voltage against ground (the E electrodes first)."""
  lines = header(kind, path.stem, volts.shape[1])
  for (a, b), per_freq in zip(injections, volts):
    lines.append(f"{a} {b}")
    for v in per_freq:
      parts = np.stack([v.real, v.imag], 1).reshape(-1)
      lines.append("\t".join(repr(float(x)) for x in parts))
  path.write_text("\n".join(lines) + "\n")


def recording(tmp_path, n: int = 3, kind: str = "full", freqs: int = 1, seed: int = 0):
  """A recording `<date time>/setup/setup_0000k.eit`; returns (folder, volts (n, P, F, 2E))."""
  rng = np.random.default_rng(seed)
  volts = rng.normal(size=(n, E, freqs, 2 * E)) + 1j * rng.normal(size=(n, E, freqs, 2 * E))
  setup = tmp_path / "20250212 13.19.50" / "setup"
  setup.mkdir(parents=True)
  for i in range(n):
    write_frame(setup / f"setup_{i + 1:05d}.eit", volts[i], kind)
  return setup.parent, volts


def by_hand(volts: np.ndarray, freq: int = 0) -> np.ndarray:
  """(n, P x E): V_i - V_{i+1} (the last electrode against the first), real part, loop by loop."""
  n, p = volts.shape[:2]
  out = np.zeros((n, p * E))
  for f in range(n):
    for k in range(p):
      for i in range(E):
        out[f, k * E + i] = (volts[f, k, freq, i] - volts[f, k, freq, (i + 1) % E]).real
  return out


@pytest.fixture(autouse=True)
def _settings(monkeypatch):
  for key in (sciospec.FREQUENCY, sciospec.REFERENCE, sciospec.PART):
    monkeypatch.delenv(key, raising=False)
  sciospec._read.cache_clear()


def read(path) -> dict:
  return array_files.read(str(path), (".mat", ".npz"), "device file")


@pytest.mark.parametrize("where", ["folder", "setup", "file"])
def test_values_are_the_hand_computed_differences(tmp_path, where):
  folder, volts = recording(tmp_path)
  path = {"folder": folder, "setup": folder / "setup", "file": folder / "setup/setup_00002.eit"}
  got = read(path[where])
  truth = by_hand(volts)
  if where == "file":
    truth = truth[1:2]
  np.testing.assert_allclose(got["frames"], truth, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(got[sciospec.EMPTY], truth.mean(0), rtol=1e-12, atol=1e-12)
  currents = got[sciospec.CURRENTS]  # +1 where the current goes in (the first), -1 out
  for k, (a, b) in enumerate(INJECTIONS):
    assert (
      currents[a - 1, k] == 1 and currents[b - 1, k] == -1 and np.abs(currents[:, k]).sum() == 2
    )


@pytest.mark.parametrize("kind", ["v1", "v2short", "full"])
def test_header_variants_give_the_same_values(tmp_path, kind):
  folder, volts = recording(tmp_path, kind=kind)
  np.testing.assert_allclose(read(folder)["frames"][:, : 2 * E], by_hand(volts)[:, : 2 * E])


def test_frequency_and_part_are_chosen(tmp_path, monkeypatch):
  folder, volts = recording(tmp_path, freqs=3)
  monkeypatch.setenv(sciospec.FREQUENCY, "2")
  np.testing.assert_allclose(read(folder)["frames"], by_hand(volts, freq=1), atol=1e-12)
  monkeypatch.setenv(sciospec.PART, "magnitude")
  sciospec._read.cache_clear()
  d = volts[0, 0, 1, 0] - volts[0, 0, 1, 1]
  assert read(folder)["frames"][0, 0] == pytest.approx(abs(d) * np.sign(d.real))
  monkeypatch.setenv(sciospec.FREQUENCY, "4")
  with pytest.raises(InputError, match="CDEIT_SCIOSPEC_FREQUENCY=4.*3 frequencies"):
    read(folder)


def test_reference_range(tmp_path, monkeypatch):
  folder, volts = recording(tmp_path, n=5)
  monkeypatch.setenv(sciospec.REFERENCE, "2-4")
  got = read(folder)
  np.testing.assert_allclose(got[sciospec.EMPTY], by_hand(volts)[1:4].mean(0), atol=1e-12)
  assert "frames 2-4, setup_00002.eit to setup_00004.eit" in str(got[sciospec.NAME])
  monkeypatch.setenv(sciospec.REFERENCE, "4-9")
  with pytest.raises(InputError, match="holds frames 1-5"):
    read(folder)
  monkeypatch.setenv(sciospec.REFERENCE, "first")
  with pytest.raises(InputError, match="CDEIT_SCIOSPEC_REFERENCE"):
    read(folder)


def test_device_file_and_recording(tmp_path):
  """The folder is a device (its empty tank its frame) and a frames file (every frame)."""
  folder, volts = recording(tmp_path, n=4)
  lay, frame = layout.from_device_file(str(folder))
  assert (lay.num_electrodes, lay.num_patterns, lay.num_values) == (E, E, E * E)
  np.testing.assert_allclose(frame, by_hand(volts).mean(0), atol=1e-12)
  # measured pairs: electrode i (+) against i + 1 (-), from 0, in every pattern
  np.testing.assert_array_equal(lay.rows[:E, 1:], [(i, (i + 1) % E) for i in range(E)])
  with frames.Recording(str(folder), E * E) as rec:
    assert rec.n == 4 and rec.device is not None
    np.testing.assert_allclose(rec.rows(0, 4), by_hand(volts), atol=1e-12)
    np.testing.assert_allclose(rec.empty, frame)
    assert "frames 1-4" in rec.empty_where


def _damage(path: pathlib.Path, how: str) -> int:
  """Damage a frame file; returns the line (from 1) the refusal must name, or 0 for none."""
  lines = path.read_text().splitlines()
  if how == "empty":
    path.write_text("")
    return 0
  if how == "cut":  # cut in half, in the middle of a line of voltages
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    return len(text[: len(text) // 2].splitlines())
  if how == "short":  # one line of voltages lacks its last number
    lines[18 + 3] = lines[18 + 3].rsplit("\t", 1)[0]
    path.write_text("\n".join(lines) + "\n")
    return 22
  if how == "letters":
    fields = lines[18 + 1].split("\t")
    fields[5] = "0.12x4"
    lines[18 + 1] = "\t".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return 20
  if how == "missing_voltages":  # the last injection's line of voltages gone
    path.write_text("\n".join(lines[:-1]) + "\n")
    return len(lines) - 1
  raise ValueError(how)


@pytest.mark.parametrize("how", ["empty", "cut", "short", "letters", "missing_voltages"])
def test_a_damaged_frame_is_refused_in_one_line(tmp_path, how):
  folder, _ = recording(tmp_path)
  bad = folder / "setup/setup_00002.eit"
  line = _damage(bad, how)
  with pytest.raises(InputError) as e:
    read(folder)
  text = str(e.value)
  assert "\n" not in text and text.startswith(str(bad))
  assert (f": line {line}:" in text) if line else "empty (0 bytes)" in text


def test_a_missing_injection_or_other_injections_are_refused_naming_the_files(tmp_path):
  folder, volts = recording(tmp_path, n=4)
  setup = folder / "setup"
  write_frame(setup / "setup_00003.eit", volts[2][:-1], injections=INJECTIONS[:-1])
  swapped = [(b, a) for a, b in INJECTIONS]
  write_frame(setup / "setup_00004.eit", volts[3], injections=swapped)
  with pytest.raises(InputError, match=r"2 frame file\(s\) differ .* injections.*"
                     r"setup_00003.eit \(7\), setup_00004.eit \(8\)"):  # fmt: skip
    read(folder)


def test_a_first_frame_without_an_injection_is_the_one_named(tmp_path):
  folder, volts = recording(tmp_path, n=3)
  write_frame(folder / "setup/setup_00001.eit", volts[0][1:], injections=INJECTIONS[1:])
  with pytest.raises(InputError, match=r"1 frame file\(s\) differ .*: setup_00001.eit \(7\);"):
    read(folder)


def test_other_header_is_refused(tmp_path):
  folder, volts = recording(tmp_path, n=3)
  write_frame(folder / "setup/setup_00002.eit", volts[1], kind="v2short")
  with pytest.raises(InputError, match=r"in their header \(header_lines.*setup_00002.eit"):
    read(folder)


def test_gap_in_frame_numbers_is_refused(tmp_path):
  folder, _ = recording(tmp_path, n=5)
  (folder / "setup/setup_00003.eit").unlink()
  with pytest.raises(InputError, match="after setup_00002.eit comes setup_00004.eit"):
    read(folder)


def test_setup_file_must_agree(tmp_path):
  folder, _ = recording(tmp_path, n=2)
  rows = "\n".join(f"{a}, {b}, 1," for a, b in INJECTIONS)
  (folder / "setup.setUp").write_text(
    f"Version: 2\nCurrentExcitationPattern: \n{rows}\nSettings: 1\n"
  )
  read(folder)  # agrees
  sciospec._read.cache_clear()
  rows = "\n".join(f"{b}, {a}, 1," for a, b in INJECTIONS)
  (folder / "setup.setUp").write_text(f"CurrentExcitationPattern: \n{rows}\n")
  with pytest.raises(InputError, match="setup.setUp: its CurrentExcitationPattern"):
    read(folder)


def test_no_frames_is_missing(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(InputError, match="a folder"):
    read(tmp_path / "empty")
  with pytest.raises(MissingFile):
    sciospec.frame_files(str(tmp_path / "empty"))


def test_calibrate_writes_nothing_for_a_damaged_recording(tmp_path):
  from cdeit_jax import calibrate

  folder, _ = recording(tmp_path)
  _damage(folder / "setup/setup_00003.eit", "cut")
  out = tmp_path / "run" / "device.npz"
  with pytest.raises(InputError, match="setup_00003.eit: line"):
    calibrate.calibrate(
      str(folder), str(out), patterns=None, width_deg=None, electrode_cm=None, tank_cm=None,
      contact_impedance=None, first_deg=None, clockwise=None, electrodes=False,
    )  # fmt: skip
  assert not out.parent.exists() or not os.listdir(out.parent)


def _shared() -> pathlib.Path:
  """`<repo>/../shared/data/sciospec`; in a git worktree, also beside the main checkout."""
  repo = pathlib.Path(__file__).resolve().parents[1]
  roots = [repo]
  git = repo / ".git"
  if git.is_file() and git.read_text().startswith("gitdir:"):  # a worktree: .git names its dir
    roots.append(pathlib.Path(git.read_text().split(":", 1)[1].strip()).parents[2])
  found = [r / ".." / "shared" / "data" / "sciospec" for r in roots]
  return next((f for f in found if f.is_dir()), found[0])


REAL = _shared() / "20250212 13.19.50"


@pytest.mark.skipif(not REAL.is_dir(), reason="the shared Sciospec recording is absent")
def test_the_shared_recording():
  """255 frames of 16 adjacent injections x 16 adjacent pairs; the first 55 frames are the empty
  tank (within 0.1 % of the reference), later ones hold the object (changes of a few %)."""
  got = read(REAL)
  f, ref = got["frames"], got[sciospec.EMPTY]
  assert f.shape == (255, 256) and ref.shape == (256,)
  change = np.linalg.norm(f - ref, axis=1) / np.linalg.norm(ref)
  assert change[:55].max() < 1e-3 and change.max() > 0.01
  lay, frame = layout.from_device_file(str(REAL / "setup"))
  assert lay.describe().endswith("(16 electrodes, 16 patterns, adjacent, 256 values)")
  np.testing.assert_allclose(frame, f[:20].mean(0))
