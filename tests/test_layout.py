"""Any EIT system (eit.layout): the measuring-system object from rules, presets and device files,
KTC2023's and UEF's files, and its forward model. (KTC2023's score: test_ktc_score.py; the
challenge command: test_challenge.py.)"""

import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.io
import scipy.signal
from conftest import device_arrays

from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files, fem, mesh
from cdeit_jax.eit import layout as lay

REPO = pathlib.Path(__file__).parent.parent
LEVELS = REPO / "data" / "ktc2023" / "levels"


def test_cdeit16_preset_is_the_eidors_protocol_and_its_forward_model_the_fixed_one():
  """The 16-electrode path is unchanged: the preset lists EIDORS's adjacent protocol (written
  out here: injection k drives -I at k and +I at k+1, measures U_m - U_m+1 for every m whose pair
  touches neither) and the CEM given it computes what the fixed CEM does (float64, bit for
  bit)."""
  c = lay.preset("cdeit16")
  pairs = [[m for m in range(16) if not {m, (m + 1) % 16} & {k, (k + 1) % 16}] for k in range(16)]
  currents = np.zeros((16, 16))
  currents[np.arange(16), np.arange(16)] = -1.0
  currents[(np.arange(16) + 1) % 16, np.arange(16)] = 1.0
  assert c.num_values == 208 and c.num_patterns == 16
  np.testing.assert_array_equal(c.rows[:, 0], np.repeat(np.arange(16), 13))
  np.testing.assert_array_equal(c.rows[:, 1], np.ravel(pairs))
  np.testing.assert_array_equal(c.rows[:, 2], (np.ravel(pairs) + 1) % 16)
  np.testing.assert_array_equal(c.currents, currents)
  assert mesh.spec_for(c) == mesh.MeshSpec()
  with jax.enable_x64(True):
    m = mesh.make_mesh(mesh.MeshSpec())
    a = fem.CEM(m, dtype=jnp.float64, layout=lay.preset("cdeit16"))
    b = fem.CEM(m, dtype=jnp.float64, layout=c)
    sigma = 1 + 0.5 * jnp.asarray(np.random.default_rng(0).random(a.num_elements))
    np.testing.assert_array_equal(np.asarray(a.voltages(sigma)), np.asarray(b.voltages(sigma)))


def test_ktc2023_preset_is_the_challenges_own_patterns():
  """The preset's rule (16 skip-1 pairs, 60 against electrodes 0, 8, 16, 24; 31 adjacent
  differences over all 32 electrodes) gives the challenge's Injref directions and Mpat."""
  ref = scipy.io.loadmat(LEVELS / "level_1" / "ref.mat")
  k = lay.preset("ktc2023")
  np.testing.assert_array_equal(k.currents, np.sign(ref["Injref"]))
  mpat = ref["Mpat"].astype(float)
  for m in range(31):  # measurement m of every pattern is Mpat[:, m] . U
    assert mpat[k.rows[m, 1], m] == 1 and mpat[k.rows[m, 2], m] == -1
  read, values = lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))
  assert read.measures_as(k) and read.name.startswith("ktc2023")
  # the file's electrodes are the preset's (the organisers' mesh's) turned by half a spacing
  from cdeit_jax.eit import turns

  assert np.rad2deg(turns.offset(k, read)) == pytest.approx(90.0 - 84.375)
  assert np.rad2deg(k.angles[1] - k.angles[0]) == pytest.approx(11.25)
  np.testing.assert_array_equal(values, ref["Uelref"].ravel())
  np.testing.assert_allclose(read.currents, ref["Injref"] / np.abs(ref["Injref"]).max())


def test_removed_electrodes_lose_the_values_the_challenges_levels_lose():
  """Level K of KTC2023 removes electrodes 0 .. 2K-3: its NaN values are exactly those that
  `Layout.without` says a device loses without them (pairs touching them, patterns through
  them): 732, 952, 1156, 1344, 1726, 1843 values at levels 2-7."""
  k = lay.preset("ktc2023")
  counts = []
  for level in range(1, 8):
    frame = scipy.io.loadmat(LEVELS / f"level_{level}" / "data1.mat")["Uel"].ravel()
    gone = k.without(range(2 * (level - 1)))
    np.testing.assert_array_equal(np.isnan(frame), gone)
    counts.append(int(gone.sum()))
  assert counts == [0, 732, 952, 1156, 1344, 1726, 1843]


@pytest.mark.parametrize(
  "rule, measure_injecting, count",
  [
    # hand counts: each current-carrying electrode removes the 2 adjacent pairs touching it
    ("adjacent", False, 16 * 13),  # 3 pairs touch electrodes k, k+1
    ("skip-2", False, 16 * 12),  # k and k+3: 4 pairs
    ("opposite", False, 16 * 12),
    ("against-0", False, 2 * 13 + 13 * 12),  # neighbours 1 and 15 share a pair with 0
    ("skip-2", True, 16 * 16),
  ],
)
def test_rules_count_the_measurements_by_hand(rule, measure_injecting, count):
  layout = lay.from_rules(16, injection=rule, measure_injecting=measure_injecting)
  assert layout.num_values == count
  assert np.all(layout.currents.sum(0) == 0) and np.all(np.abs(layout.currents).sum(0) == 2)
  if not measure_injecting:  # no measured pair touches a current-carrying electrode
    carry = layout.currents[:, layout.rows[:, 0]].T != 0
    r = np.arange(len(layout.rows))
    assert not np.any(carry[r, layout.rows[:, 1]] | carry[r, layout.rows[:, 2]])


def test_bad_rules_are_one_line_errors():
  for kwargs, words in (
    (dict(injection="diagonal"), "'adjacent', 'opposite', 'skip-K' or 'against-K'"),
    (dict(injection="skip-15"), "skip must be in 0..14"),
    (dict(num_electrodes=15, injection="opposite"), "even electrode count"),
    (dict(measurement="skip-x"), "'adjacent' or 'skip-K'"),
  ):
    with pytest.raises(InputError, match=words):
      lay.from_rules(**kwargs)


def test_rules_take_any_integer_and_refuse_what_is_not_a_ring():
  """A numpy integer is an electrode count; a missing rule, a pattern that would measure
  nothing, an electrode width that is not positive, NaN or wider than the gaps, and removed
  electrodes that are not numbers 0..E-1 are each one line; a boolean mask of the electrodes
  removes what its indices remove."""
  assert lay.from_rules(np.int64(16)).num_values == 208
  for kwargs, words in (
    (dict(injection=None), "injection=None: give a rule's name"),
    (dict(num_electrodes=4, injection="opposite"), "pattern 0 measures nothing"),
    (dict(width_deg=0), "electrode width 0 degrees must be > 0"),
    (dict(width_deg=-1.0), "electrode width -1 degrees must be > 0"),
    (dict(width_deg=float("nan")), "electrode width nan degrees"),
    (dict(width_deg=30.0), r"below the narrowest gap between centres \(22.5 degrees\)"),
  ):
    with pytest.raises(InputError, match=words):
      lay.from_rules(**kwargs)
  ktc = lay.preset("ktc2023")
  for electrodes in ([32], [-1], [0.5], np.ones(3, bool)):
    with pytest.raises(InputError, match="electrode numbers from 0 to 31|must have 32 entries"):
      ktc.without(electrodes)
  mask = np.zeros(32, bool)
  mask[[0, 1, 5]] = True
  np.testing.assert_array_equal(ktc.without(mask), ktc.without([0, 1, 5]))
  assert ktc.without(mask).sum() == ktc.without([0, 1, 5]).sum() > 0


@pytest.mark.parametrize("suffix", [".mat", ".npz"])
def test_a_device_file_reads_the_same_in_both_key_conventions(tmp_path, suffix):
  """A 16-electrode skip-2 device measuring on every adjacent pair: its file with KTC's keys
  (values pattern by pattern in one column) and with UEF's (one column per pattern) give the
  rule's layout and the values in the rule's order."""
  rule = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  inj, mpat = device_arrays(rule)
  values = 1000.0 * rule.rows[:, 0] + np.arange(rule.num_values) % 16  # pattern, then pair
  ktc = {"Inj": inj, "Mpat": mpat, "Uel": values[:, None]}
  uef = {"CurrentPattern": inj, "MeasPattern": mpat, "Uel": values.reshape(16, 16).T}
  for name, arrays, clockwise in (("ktc", ktc, True), ("uef", uef, None)):
    path = str(tmp_path / f"{name}{suffix}")
    if suffix == ".mat":
      scipy.io.savemat(path, arrays)
    else:
      np.savez(path, **arrays)
    read, got = lay.from_device_file(path, clockwise=clockwise)
    assert read.signature == rule.signature, name
    np.testing.assert_array_equal(read.rows, rule.rows)
    np.testing.assert_array_equal(got, values)


def test_device_file_errors_name_the_file_and_what_is_wrong(tmp_path):
  rule = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  inj, mpat = device_arrays(rule)
  bad = mpat.copy()
  bad[0, 3] = 2
  path = str(tmp_path / "bad.mat")
  scipy.io.savemat(path, {"Inj": inj, "Mpat": bad})
  with pytest.raises(InputError, match=r"bad\.mat: Mpat column 3 is not one \+1 and one -1"):
    lay.from_device_file(path)
  scipy.io.savemat(path, {"U": inj})
  with pytest.raises(InputError, match=r"bad\.mat: no measuring system found.*it has \['U'\]"):
    lay.from_device_file(path)
  scipy.io.savemat(path, {"Inj": inj, "Mpat": mpat, "Uel": np.zeros((5, 1))})
  with pytest.raises(InputError, match=r"Uel \(5, 1\) is not one frame of these patterns: give"):
    lay.from_device_file(path)


def test_any_layouts_forward_model_obeys_reciprocity():
  """Reciprocity (Geselowitz): the voltage between electrodes c, d while driving a, b equals the
  voltage between a, b while driving c, d, for any conductivity, so the transfer matrix
  I_q . U(I_p) is symmetric: checked on a 32-electrode skip-3 layout, an inhomogeneous medium and
  a mesh made for it."""
  layout = lay.from_rules(32, injection="skip-3", measure_injecting=True)
  m = mesh.make_mesh(mesh.spec_for(layout))
  with jax.enable_x64(True):
    cem = fem.CEM(m, 0.05, dtype=jnp.float64, layout=layout)
    sigma = 1 + np.random.default_rng(1).random(cem.num_elements)
    u = np.asarray(cem.electrode_potentials(jnp.asarray(sigma)))  # (32 electrodes, 32 patterns)
  z = layout.currents.T @ u  # (32, 32): pattern q's currents against pattern p's potentials
  assert np.abs(z).max() > 0
  np.testing.assert_allclose(z, z.T, rtol=0, atol=1e-9 * np.abs(z).max())


def test_frames_of_another_system_are_named_in_the_refusal(tmp_path):
  """The 208-value frames reader refuses KTC2023's 2,356-value frames in one line
  that names the system they fit."""
  from cdeit_jax.infer import frames

  _, values = lay.from_device_file(str(LEVELS / "level_1" / "data1.mat"))
  np.save(tmp_path / "ktc.npy", values[None])
  with pytest.raises(InputError, match=r"got shape \(1, 2356\) \(2356 values: as ktc2023 \(32"):
    frames.read(str(tmp_path / "ktc.npy"))


def _v73(path):
  """A MATLAB v7.3 header, as MATLAB's save -v7.3 writes it, without the HDF5 data after it."""
  text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Wed Nov 25 2026 HDF5 schema 1.00 ."
  path.write_bytes(text.ljust(116, b" ") + b"\0" * 8 + b"\x00\x02IM" + b"\0" * 512)


def test_device_files_hold_numbers_of_the_documented_shapes(tmp_path):
  """A device file's arrays are refused in one line naming the file and the key when they are
  complex, NaN or infinite currents, text, empty, or of fewer than 4 electrodes; an empty file,
  a folder, a damaged or object .npz and a v7.3 .mat's header without its HDF5 data too; `.MAT`
  reads as `.mat`."""
  rule = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  inj, mpat = device_arrays(rule)
  good = {"Inj": inj, "Mpat": mpat, "Uel": np.ones((rule.num_values, 1))}
  nan_inj, inf_inj = inj.copy(), inj.copy()
  nan_inj[0, 0], inf_inj[0, 0] = np.nan, np.inf
  inf_uel = good["Uel"].copy()
  inf_uel[3] = np.inf
  cases = [
    ({**good, "Inj": inj + 1j}, "Inj holds complex numbers; give the real"),
    ({**good, "Uel": good["Uel"] * (1 + 1j)}, r"Uel holds complex numbers; give the real"),
    ({**good, "Inj": nan_inj}, "Inj holds 1 NaN or infinite values"),
    ({**good, "Inj": inf_inj}, "Inj holds 1 NaN or infinite values"),
    ({**good, "Uel": inf_uel}, r"Uel holds 1 infinite values \(a missing value is NaN\)"),
    ({**good, "Mpat": np.array(["abc"])}, "Mpat holds <U3 values, not numbers"),
    ({**good, "Inj": np.zeros((16, 0))}, "Inj is empty"),
    ({"Inj": inj[:3, :1] - inj[:3, :1].mean(), "Mpat": mpat[:3, :1]}, "Inj has 3 electrodes"),
  ]
  for i, (arrays, words) in enumerate(cases):
    path = tmp_path / f"d{i}.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputError, match=f"{path.name}: {words}"):
      lay.from_device_file(str(path))
  (tmp_path / "empty.npz").write_bytes(b"")
  (tmp_path / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip at all")
  np.savez(tmp_path / "object.npz", Inj=np.array([{"a": 1}], dtype=object), Mpat=mpat)
  (tmp_path / "folder.mat").mkdir()
  _v73(tmp_path / "v73.mat")
  for name, words in (
    ("empty.npz", "not a readable .npz"),
    ("garbage.npz", "not a readable .npz"),
    ("object.npz", "not a readable .npz"),
    ("folder.mat", "a folder; a device file is a .mat or .npz file"),
    ("v73.mat", r"not a readable MATLAB v7.3 \(HDF5\) file"),
  ):
    with pytest.raises(InputError, match=f"{name}: {words}"):
      lay.from_device_file(str(tmp_path / name))
  scipy.io.savemat(tmp_path / "lower.mat", good)
  shutil.copy(tmp_path / "lower.mat", tmp_path / "UPPER.MAT")
  lower = lay.resolve(str(tmp_path / "lower.mat"))
  assert lay.resolve(str(tmp_path / "UPPER.MAT")).signature == lower.signature


@pytest.mark.parametrize("keys", ["KTC", "UEF"])
def test_values_as_one_column_per_pattern_read_in_pattern_order(tmp_path, keys):
  """A frame stored as a matrix of one column per pattern (M, P) reads as the same values as
  one column pattern by pattern, in either key convention (KTC2023's Uel of 31 x 76 among
  them); a matrix of one row per pattern (P, M) is refused, not read in the wrong order."""
  _, ref = lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))
  raw = scipy.io.loadmat(LEVELS / "level_1" / "ref.mat")
  names = (
    ("Injref", "Mpat", "Uelref") if keys == "KTC" else ("CurrentPattern", "MeasPattern", "Uel")
  )
  inj, mpat = raw["Injref"], raw["Mpat"]
  columns = ref.reshape(76, 31).T  # (M, P)
  scipy.io.savemat(tmp_path / "columns.mat", dict(zip(names, (inj, mpat, columns))))
  np.testing.assert_array_equal(lay.from_device_file(str(tmp_path / "columns.mat"))[1], ref)
  scipy.io.savemat(tmp_path / "rows.mat", dict(zip(names, (inj, mpat, columns.T))))
  with pytest.raises(InputError, match=r"rows.mat: Uel(ref)? \(76, 31\) is not one frame"):
    lay.from_device_file(str(tmp_path / "rows.mat"))


def test_a_matlab_v73_device_file_reads_as_its_v5_copy(tmp_path):
  """KTC2023's ref.mat saved again as MATLAB v7.3 (hdf5storage: HDF5, axes reversed, text
  beside) reads as the same device and frame as the v5 original."""
  import hdf5storage

  raw = {k: v for k, v in scipy.io.loadmat(LEVELS / "level_1" / "ref.mat").items() if k[0] != "_"}
  hdf5storage.savemat(str(tmp_path / "ref.mat"), {**raw, "note": "tank 1"}, format="7.3")
  device, ref = lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))
  got, got_ref = lay.from_device_file(str(tmp_path / "ref.mat"))
  np.testing.assert_array_equal(got.rows, device.rows)
  np.testing.assert_array_equal(got.currents, device.currents)
  np.testing.assert_array_equal(got_ref, ref)


def test_a_file_of_two_protocols_narrows_to_one_and_a_device_round_trips(tmp_path):
  """UEF2017's files hold several protocols' patterns: `patterns` keeps the columns asked for
  (the values of those patterns, in order); `save_device` writes a device with its geometry and
  calibration that reads back as the same device, in either key convention's order; bad
  selections are one line."""
  adjacent = lay.from_rules(16, measure_injecting=True)
  skip2 = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  inj = np.concatenate([adjacent.currents, skip2.currents], 1)
  _, mpat = device_arrays(skip2)
  values = np.arange(32 * 16, dtype=np.float64)  # pattern p's values: 16 p .. 16 p + 15
  scipy.io.savemat(
    tmp_path / "both.mat",
    {"CurrentPattern": inj, "MeasPattern": mpat, "Uel": values.reshape(32, 16).T},
  )
  one, v = lay.from_device_file(str(tmp_path / "both.mat"), patterns="16-31")
  assert one.signature == skip2.signature
  np.testing.assert_array_equal(v, values[256:])
  for bad in ("16-32", "3,3", "x"):
    with pytest.raises(InputError, match="patterns .*: give distinct columns of CurrentPattern"):
      lay.from_device_file(str(tmp_path / "both.mat"), patterns=bad)
  import dataclasses

  calibrated = dataclasses.replace(one, width=np.deg2rad(9.5), gain=812.5, contact_impedance=2e-3)
  device_files.save_device(str(tmp_path / "device.npz"), calibrated, v)
  back, w = lay.from_device_file(str(tmp_path / "device.npz"))
  assert back.signature == calibrated.signature and back.measures_as(one)
  assert (back.gain, back.contact_impedance) == (812.5, 2e-3)
  assert back.name == "both.mat (UEF keys)"  # the reference file's name, not the copy's
  np.testing.assert_allclose(back.angles, calibrated.angles, atol=1e-12)
  np.testing.assert_array_equal(w, v)
  assert not back.measures_as(adjacent)


def test_a_device_file_with_an_idle_or_contradicting_repeat_is_refused(tmp_path):
  """KTC2023's reference file with a pattern of no current, a pattern copied over another (its
  values still the other's), or a measured pair copied over another: each refused in one line
  naming the key and columns (before: calibrated silently at 2-3 times the residual). KTC's own
  four repeated patterns (their values agree to 0.1 %) and a pair repeated in reverse with the
  negated values read as before."""
  ref = scipy.io.loadmat(str(LEVELS / "level_1" / "ref.mat"))
  lay.from_device_file(str(LEVELS / "level_1" / "ref.mat"))

  def variant(name, change):
    d = {k: np.array(ref[k]) for k in ("Injref", "Mpat", "Uelref")}
    change(d)
    path = str(tmp_path / f"{name}.mat")
    scipy.io.savemat(path, d)
    return path

  def idle(d):
    d["Injref"][:, 5] = 0

  def copied_pattern(d):
    d["Injref"][:, 5] = d["Injref"][:, 4]

  def copied_pair(d):
    d["Mpat"][:, 3] = d["Mpat"][:, 2]

  def reversed_pair(d):
    d["Mpat"][:, 3] = -d["Mpat"][:, 2]
    u = d["Uelref"].reshape(76, 31)
    u[:, 3] = -u[:, 2]
    d["Uelref"] = u.reshape(-1, 1)

  for name, change, words in (
    ("idle", idle, r"Injref columns 5 carry no current \(all zero\)"),
    ("pattern", copied_pattern, r"Injref columns 4 and 5 are the same currents, yet their val"),
    ("pair", copied_pair, r"Mpat columns 2 and 3 are the same pair, yet their values in Uel"),
  ):
    with pytest.raises(InputError, match=rf"^{re.escape(str(tmp_path / name))}\.mat: {words}"):
      lay.from_device_file(variant(name, change))
  lay.from_device_file(variant("reversed", reversed_pair))
  with pytest.raises(InputError, match="carry no current"):  # the kept patterns only
    lay.from_device_file(variant("idle", idle), patterns="0-5")
  lay.from_device_file(variant("idle", idle), patterns="0-4")
  p = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.calibrate", f"--device={tmp_path / 'pair.mat'}"]
    + [f"--out={tmp_path / 'd.npz'}", "--noelectrodes"],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert p.returncode == 1 and p.stderr.count("error:") == 1 and "Traceback" not in p.stderr
  assert "are the same pair" in p.stderr and not (tmp_path / "d.npz").exists()
