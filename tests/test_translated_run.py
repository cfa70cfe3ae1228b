"""A translated run's checks of what it is given (`infer/translated_run.py`), on UEF2017's real
devices (data/uef2017_protocols): skip-1's device as `calibrate` fits it, translated into
models/cdeit16's system. The truth is the tank itself: its skip-1 frames and empty tank are this
device's, skip-3's another protocol's on the same electrodes, and a reversed current negates
every value; a missing value is left out of the translation and the rest determine it."""

import dataclasses
import pathlib
import re

import numpy as np
import pytest

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files
from cdeit_jax.eit import layout as lay
from cdeit_jax.infer import frame_guards, frames, translated_run

REPO = pathlib.Path(__file__).parent.parent
PROTOCOLS = REPO / "data" / "uef2017_protocols"


@pytest.fixture(scope="module")
def skip1(tmp_path_factory):
  """(the run's device, translated into cdeit16's system; its empty tank; its 22 frames)."""
  device, ref = lay.from_device_file(str(PROTOCOLS / "skip1" / "ref.mat"))
  device = dataclasses.replace(
    device, width=np.deg2rad(14.48), contact_impedance=0.0242, gain=1073.37
  )
  path = tmp_path_factory.mktemp("run") / "translation.npz"
  device_files.save_device(str(path), device, ref)
  opened = translated_run.TranslatedDevice.open(str(path), lay.preset("cdeit16"))
  return opened, ref, np.load(PROTOCOLS / "skip1" / "frames.npy")


def _refused(check, *args) -> str:
  with pytest.raises(InputError) as e:
    check(*args)
  assert "\n" not in str(e.value)
  return str(e.value)


def test_the_reference_is_the_runs_empty_tank(skip1):
  """The device's own empty tank passes, and so does every frame of the same tank (its targets
  move it by up to 18 %), at the gains a device drifts by, with values missing; another
  protocol's empty tank (skip-3's: 100 % apart on the same electrodes), the negated one (a
  reversed current) and one in other units are each refused in one line naming the run and the
  difference."""
  device, ref, frames_ = skip1
  for good in (ref, *frames_, 1.1 * ref, 0.9 * ref):
    device.check_reference(good, "--reference R")
  missing = ref.copy()
  missing[[10, 114]] = np.nan
  device.check_reference(missing, "--reference R")
  other = lay.from_device_file(str(PROTOCOLS / "skip3" / "ref.mat"))[1]
  for bad, words in (
    (other, "differs from this run's empty tank .* by 10\\d% \\(cosine 0.49"),
    (-ref, "is this run's empty tank .* negated \\(cosine -1.00\\): the current"),
    (-frames_[3], "negated"),
    (1000 * ref, "is 1e\\+03 times this run's empty tank .*: other units"),
  ):
    message = _refused(device.check_reference, bad, "--reference R")
    assert message.startswith("--reference R: ") and "skip 1" in message
    assert re.search(words, message), message


def test_missing_values_are_left_out_and_only_an_undeterminable_frame_is_refused(skip1):
  """A column of NaN (a value the device did not measure), a whole pattern or an electrode's
  values missing: the rest determine the model's 208 values (the translation within 0.3 %,
  0.6 % and 1.0 % of the whole frame's at its largest), and no row is refused; a frame of a
  handful of values cannot determine them and is refused, naming the rows and the values it
  misses."""
  device, ref, frames_ = skip1
  v = (frames_ - ref) / device.device.gain
  whole = device(v)
  for missing, within in (
    ([10], 0.003),
    (np.flatnonzero(device.device.rows[:, 0] == 5), 0.007),
    (np.flatnonzero((device.device.rows[:, 1:] == 3).any(1)), 0.012),
  ):
    partial = v.copy()
    partial[:, missing] = np.nan
    rows, note = device.undetermined(partial)
    assert not rows.any() and note == ""
    assert np.abs(device(partial) - whole).max() < within * np.abs(whole).max()
  few = v.copy()
  few[1:3, 8:] = np.nan  # rows 1 and 2 keep 8 values of 256
  few[5] = np.nan  # row 5 none
  rows, note = device.undetermined(few)
  assert np.flatnonzero(rows).tolist() == [1, 2, 5]
  assert "rows 1, 2 miss 248 of the device's 256 values (value 8: pattern" in note
  assert "rows 5 miss 256" in note and "cannot infer" in note


def test_a_device_file_of_another_protocol_is_refused_as_frames_or_reference(skip1):
  """skip-3's ref.mat read as frames (or as the reference) of the skip-1 run: its currents are
  not the run's, and it is refused naming both protocols; skip-1's own file passes."""
  device, _, _ = skip1
  with frames.Recording(str(PROTOCOLS / "skip1" / "ref.mat"), 256) as own:
    frame_guards.check_source(own, device.device, "--reference ref.mat")
  with frames.Recording(str(PROTOCOLS / "skip3" / "ref.mat"), 256) as other:
    message = _refused(frame_guards.check_source, other, device.device, "--reference ref.mat")
  assert "skip 3" in message and "skip 1" in message and "another protocol's" in message


def test_frames_are_checked_against_the_reference_they_are_differenced_with(skip1):
  """The run's frames against the reference they are differenced with
  (`eit.reference_match.check_frames`, which `FrameGuards.difference` applies on every path):
  each protocol's own 22 targets with its own empty tank, and KTC2023's 28 targets with their
  level's (objects move them by up to 23 %), pass; skip-3's frames with skip-1's empty tank (the
  run's own reference: its check passes) are refused in one line naming the rows and both
  files, and so are skip-1's frames negated or in millivolts, and difference frames given with
  a reference."""
  import scipy.io

  from cdeit_jax.eit import reference_match

  device, ref, frames_ = skip1
  other_ref = lay.from_device_file(str(PROTOCOLS / "skip3" / "ref.mat"))[1]
  other = np.load(PROTOCOLS / "skip3" / "frames.npy")
  check = lambda f, r: reference_match.check_frames(f, r, "--frames F", "--reference R", "FIX")
  check(frames_, ref)
  check(other, other_ref)
  for level in sorted((REPO / "data" / "ktc2023" / "levels").glob("level_*")):
    empty = scipy.io.loadmat(level / "ref.mat")["Uelref"].ravel()
    for data in sorted(level.glob("data*.mat")):
      check(scipy.io.loadmat(data)["Uel"].ravel(), empty)
  device.check_reference(ref, "--reference R")  # the reference is the run's
  for f, words in (
    (
      other,
      r"rows 0, 1, .* and 12 more differ from the reference frame \(--reference R\) by "
      r"\d+% \(cosine 0\.4\d; .* not of its protocol, device or tank; .* \(FIX\)",
    ),
    (-frames_, r"rows 0, .* are the reference frame \(--reference R\) negated \(cosine -1\.00"),
    (1e3 * frames_, r"rows 0, .* are 1\.\d+e\+03 times the reference frame .*other units"),
    (frames_ - ref, r"differ from the reference frame .*difference voltages already"),
  ):
    message = _refused(check, f, ref)
    assert message.startswith("--frames F: ") and re.search(words, message), message
  mixed = frames_.copy()
  mixed[[4, 9]] = other[[4, 9]]
  assert "--frames F: rows 4, 9 differ" in _refused(check, mixed, ref)
