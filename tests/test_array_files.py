"""The one registry of file formats (`cdeit_jax.common.array_files`) and of device-file keys
(`eit.device_files.DeviceFormat`): a new format or vendor is one registration and a test, and
both device files and frames files read through them."""

import json

import numpy as np
import pytest
from conftest import REPO

from cdeit_jax.common import array_files
from cdeit_jax.common.errors import InputError
from cdeit_jax.eit import device_files, pattern_rules
from cdeit_jax.eit import layout as lay
from cdeit_jax.infer import frames


@pytest.fixture
def registries(monkeypatch):
  """The registries as they are, restored after the test."""
  monkeypatch.setattr(array_files, "READERS", dict(array_files.READERS))
  monkeypatch.setattr(device_files, "DEVICE_FORMATS", dict(device_files.DEVICE_FORMATS))


def _arrays(layout, values) -> dict:
  """A vendor's arrays: currents, the shared measured pairs, the empty tank's values."""
  pairs = layout.rows[layout.rows[:, 0] == 0][:, 1:]
  mpat = np.zeros((layout.num_electrodes, len(pairs)))
  mpat[pairs[:, 0], np.arange(len(pairs))], mpat[pairs[:, 1], np.arange(len(pairs))] = 1, -1
  return {"currents": layout.currents, "pairs": mpat, "empty": values.reshape(-1, 1)}


def test_a_new_vendor_and_a_new_format_are_one_registration_each(registries, tmp_path):
  """A vendor whose files name the arrays `currents`, `pairs` and `empty` and number the
  electrodes clockwise: unregistered, its file is refused naming the keys that are known;
  registered, it reads back as the device (rows, currents, values, clockwise angles) and as a
  frames file (its one frame). A JSON format of its own is refused as a device file until a
  reader is registered for it."""
  device = lay.from_rules(16, injection="skip-2", measure_injecting=True)
  values = np.arange(device.num_values, dtype=np.float64) + 1.0
  arrays = _arrays(device, values)
  npz = tmp_path / "ref.npz"
  np.savez(npz, **arrays)
  with pytest.raises(InputError, match=r"ref.npz: no measuring system found; .*KTC's keys"):
    lay.from_device_file(str(npz))
  acme = device_files.DeviceFormat("ACME", ("currents",), ("pairs",), ("empty",), True)
  device_files.register_device_format(acme)
  got, ref = lay.from_device_file(str(npz))
  np.testing.assert_array_equal(got.rows, device.rows)
  np.testing.assert_allclose(got.currents, device.currents / np.abs(device.currents).max())
  np.testing.assert_array_equal(ref, values)
  np.testing.assert_allclose(got.angles, pattern_rules.evenly_spaced(16, 90.0, clockwise=True))
  assert got.name == "ref.npz (ACME keys)"
  v, reference, _ = frames.read(str(npz), device.num_values)
  np.testing.assert_array_equal(v, values[None])
  assert reference is None

  path = tmp_path / "ref.json"
  path.write_text(json.dumps({k: v.tolist() for k, v in arrays.items()}))
  with pytest.raises(InputError, match=r"ref.json: a device file is a \.mat or \.npz file"):
    lay.from_device_file(str(path))

  @array_files.reader(".json")
  def _json(p: str) -> dict:
    return {k: np.asarray(v, np.float64) for k, v in json.loads(array_files.raw(p)).items()}

  got = array_files.read(str(path), (".json",), "device file")
  np.testing.assert_array_equal(got["empty"][:, 0], values)


def test_every_format_reads_the_same_frames(tmp_path):
  """The same frames (3 x 5) as .npy, .npz, .mat, .csv (with a header) and .txt read as equal
  arrays through the registry; a damaged file of each binary format is one line naming it."""
  import scipy.io

  a = np.arange(15, dtype=np.float64).reshape(3, 5) / 7
  np.save(tmp_path / "f.npy", a)
  np.savez(tmp_path / "f.npz", frames=a)
  scipy.io.savemat(tmp_path / "f.mat", {"frames": a})
  (tmp_path / "f.csv").write_text(
    "a,b,c,d,e\n" + "\n".join(",".join(map(repr, r.tolist())) for r in a)
  )
  (tmp_path / "f.txt").write_text("\n".join(" ".join(map(repr, r.tolist())) for r in a))
  for name in ("f.npy", "f.npz", "f.mat", "f.csv", "f.txt"):
    v, _, _ = frames.read(str(tmp_path / name), 5)
    np.testing.assert_array_equal(v, a, err_msg=name)
  for name, words in (
    ("bad.npy", "bad.npy: not a"),
    ("bad.npz", "bad.npz: not a readable .npz"),
    ("bad.mat", "bad.mat: not a readable .mat"),
  ):
    (tmp_path / name).write_bytes(b"\x00garbage")
    with pytest.raises(InputError, match=words):
      frames.read(str(tmp_path / name), 5)


def test_a_recording_is_read_a_block_at_a_time(tmp_path):
  """The same 50 frames of 5 values and their true images as .npy, np.savez's .npz (each member
  memory-mapped where it lies in the archive), a compressed .npz (read whole), MATLAB v7.3 files
  from another writer (hdf5storage; frames as rows and as columns, read from their HDF5
  datasets) and a .csv with a comment, a header and blank lines (parsed by rows): any block of
  rows reads as the frames' rows, and the true images of any rows as theirs."""
  import hdf5storage

  rng = np.random.default_rng(0)
  a = rng.standard_normal((50, 5))
  t = rng.standard_normal((50, 4, 4)).astype(np.float32)
  np.save(tmp_path / "f.npy", a)
  np.savez(tmp_path / "f.npz", frames=a, targets=t)
  np.savez_compressed(tmp_path / "z.npz", frames=a, targets=t)
  for name, arrays in (("f.mat", {"frames": a, "targets": t}), ("c.mat", {"frames": a.T.copy()})):
    hdf5storage.savemat(str(tmp_path / name), arrays, format="7.3")
  lines = [",".join(map(repr, r.tolist())) for r in a]
  (tmp_path / "f.csv").write_text(
    "# a comment\nm0,m1,m2,m3,m4\n" + "\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:])
  )
  lazy = {"f.npy": np.memmap, "f.npz": np.memmap, "z.npz": np.ndarray}
  for name in ("f.npy", "f.npz", "z.npz", "f.mat", "c.mat", "f.csv"):
    with frames.Recording(str(tmp_path / name), 5) as r:
      assert r.n == 50 and r.reference is None, name
      if name in lazy:
        got = r._arrays.get("frames", r._arrays.get(array_files.SINGLE))
        assert type(got) is lazy[name], name
      for lo, hi in ((0, 1), (7, 33), (40, 60)):
        np.testing.assert_array_equal(r.rows(lo, hi), a[lo:hi], err_msg=name)
      if name in ("f.npz", "z.npz", "f.mat"):
        np.testing.assert_array_equal(r.targets(np.array([3, 41])), t[[3, 41]], err_msg=name)


def test_a_bad_row_far_into_a_text_recording_is_named(tmp_path):
  """A .csv is parsed by rows: a word or a short row far down is an error naming the data row
  (counted from 0), its line (a comment line above counted) and what it holds, when that block
  is read, without numpy's advice (`usecols`, its own API's); the other blocks read as
  written."""
  a = np.arange(200, dtype=np.float64).reshape(40, 5)
  rows = [",".join(map(repr, r.tolist())) for r in a]
  rows[37] = rows[37].replace("186.0", "x")
  rows[30] = "150.0,151.0,152.0,153.0"
  (tmp_path / "f.csv").write_text("# volts\n" + "\n".join(rows))
  with frames.Recording(str(tmp_path / "f.csv"), 5) as r:
    np.testing.assert_array_equal(r.rows(0, 30), a[:30])
    for lo, hi, words in (
      (
        30,
        31,
        r"f.csv: not a table of numbers \(data row 30, line 32: holds 4 numbers, data row "
        r"0 5\); give one row",
      ),
      (25, 35, r"\(data row 30, line 32: holds 4 numbers"),
      (32, 40, r"f.csv: not a table of numbers \(data row 37, line 39: 'x' is not a number\)"),
    ):
      with pytest.raises(InputError, match=words) as e:
        r.rows(lo, hi)
      assert "usecols" not in str(e.value) and "\n" not in str(e.value)


def test_text_frames_are_read_as_people_write_them(tmp_path):
  """Real frames (3 of UEF2017's, 208 voltages each) written as spreadsheets and Python write
  them: every form gives the same 3 rows as the plain .csv, none loses its first frame; decimal
  commas are refused in one line naming them."""
  cases = sorted((REPO / "data" / "uef2017").glob("*.npz"))[:3]
  ys = np.stack([np.load(p)["ys"].ravel() for p in cases])
  rows = lambda sep: [sep.join(repr(v) for v in r) for r in ys.tolist()]
  header = ",".join(str(i) for i in range(1, 209))
  forms = {
    "plain.csv": ("utf-8", "\n", rows(",")),
    "excel_utf8.csv": ("utf-8-sig", "\r\n", rows(",")),  # Excel's "CSV UTF-8": a mark, CRLF
    "tabs.txt": ("utf-8-sig", "\r\n", rows("\t")),
    "semicolons.csv": ("utf-8", "\n", rows(";")),
    "numbered.csv": ("utf-8-sig", "\n", [header, *rows(",")]),  # the columns' numbers on top
    "named.csv": ("utf-8-sig", "\n", [",".join(f"V{i}" for i in range(208)), *rows(",")]),
  }
  for name, (encoding, end, lines) in forms.items():
    with open(tmp_path / name, "w", encoding=encoding, newline="") as fh:
      fh.write(end.join(lines) + end)
    got = array_files.read(str(tmp_path / name), (".csv", ".txt"), "frames file")[""]
    np.testing.assert_array_equal(got, ys, err_msg=name)
  with open(tmp_path / "one.csv", "w", encoding="utf-8-sig") as fh:  # a --reference: one frame
    fh.write(rows(",")[0])
  np.testing.assert_array_equal(
    array_files.read(str(tmp_path / "one.csv"), (".csv",), "reference")[""], ys[:1]
  )
  (tmp_path / "commas.csv").write_text("\n".join(r.replace(".", ",") for r in rows(";")))
  with pytest.raises(InputError, match=r"commas.csv: decimal commas \(") as e:
    array_files.read(str(tmp_path / "commas.csv"), (".csv",), "frames file")
  assert "\n" not in str(e.value)


def test_files_that_hold_no_frames_say_what_they_hold(tmp_path):
  """A MATLAB v7.3 file of complex frames, an HDF5 file named .mat without MATLAB's header and an
  .npz whose member is no .npy: one line each, naming what the file holds and why it is not
  read (no 'it holds nothing', no reader's raw words)."""
  import io
  import zipfile

  import h5py
  import hdf5storage

  ys = np.random.default_rng(0).standard_normal((3, 208))
  hdf5storage.savemat(str(tmp_path / "complex.mat"), {"frames": ys + 1j * ys}, format="7.3")
  with h5py.File(tmp_path / "plain.mat", "w") as f:
    f["frames"] = ys
  buf = io.BytesIO()
  np.save(buf, ys)
  with zipfile.ZipFile(tmp_path / "odd.npz", "w") as z:
    z.writestr("frames", buf.getvalue())
  for name, message in (
    ("complex.mat", r"no array of numbers \(besides 'frames': complex numbers"),
    ("plain.mat", r"an HDF5 file without MATLAB's v7.3 header .*\(save -v7.3\)"),
    ("odd.npz", r"besides 'frames': not an .npy member \(np.savez names them NAME.npy\)"),
  ):
    with pytest.raises(InputError, match=message) as e:
      frames.read(str(tmp_path / name))
    assert "\n" not in str(e.value) and name in str(e.value)


def test_the_streamed_npz_writer_packs_np_savez_s_layout(tmp_path):
  """`common.streamed_npz`: rows written in any order (a block of a (K, N, ...) array by (k, i))
  and read back, packed beside small arrays in the order given: each member the bytes np.save
  writes, the whole read by np.load and by `array_files` (memory-mapped), no file left behind."""
  import io
  import zipfile

  from cdeit_jax.common import streamed_npz

  rng = np.random.default_rng(0)
  a, s = rng.standard_normal((5, 2, 3)), rng.standard_normal((2, 5, 3))
  w = streamed_npz.StreamedNpz(str(tmp_path), {"a": a.shape, "s": s.shape})
  w.write("a", 2, a[2:])
  w.write("a", 0, a[:2])
  for k in (1, 0):
    w.write("s", (k, 3), s[k, 3:])
    w.write("s", (k, 0), s[k, :3])
  np.testing.assert_array_equal(w.read("a", 1, 3), a[1:4].astype(np.float32))
  np.testing.assert_array_equal(w.read("s", (1, 2), 2), s[1, 2:4].astype(np.float32))
  names = np.asarray(["x", "y"])
  w.pack(str(tmp_path / "out.npz"), ["a", ("names", names), "s"])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]
  with zipfile.ZipFile(tmp_path / "out.npz") as z:
    assert z.namelist() == ["a.npy", "names.npy", "s.npy"]
    for member, want in (("a", a.astype(np.float32)), ("names", names), ("s", s.astype("<f4"))):
      buf = io.BytesIO()
      np.save(buf, want, allow_pickle=False)
      assert z.read(f"{member}.npy") == buf.getvalue()
  with np.load(tmp_path / "out.npz") as z:
    np.testing.assert_array_equal(z["s"], s.astype(np.float32))
  with array_files.open(str(tmp_path / "out.npz"), (".npz",), "test file") as arrays:
    np.testing.assert_array_equal(np.asarray(arrays["a"]), a.astype(np.float32))


def test_text_frames_of_any_line_shape_are_read_in_one_pass(tmp_path, monkeypatch):
  """UEF2017's frames (208 values) as a .csv with CR-only line ends (old Macs, some
  instruments) read equal to the LF one; all on one line (2,000 frames: 416,000 values) they
  are refused in one line naming the count and the rows the model reads, no reshape guessed;
  one number a row, the file is refused once its first rows say so (the pass over the file
  stops after 209 of its 41,600 rows: its memory does not grow with the file). The one pass
  reads the file a chunk at a time (a 4 kB chunk here: a line spans many) and scans each
  byte once: its bytes read are the file's."""
  monkeypatch.setattr(array_files, "CHUNK", 4096)
  cases = sorted((REPO / "data" / "uef2017").glob("*.npz"))[:4]
  ys = np.stack([np.load(p)["ys"].ravel() for p in cases]).astype(np.float64)
  rows = [",".join(repr(v) for v in r) for r in ys.tolist()]
  for name, text in (("lf.csv", "\n".join(rows) + "\n"), ("cr.csv", "\r".join(rows) + "\r")):
    (tmp_path / name).write_bytes(text.encode())
    with frames.Recording(str(tmp_path / name)) as r:
      np.testing.assert_array_equal(r.rows(0, r.n), ys, err_msg=name)
  (tmp_path / "mixed.txt").write_bytes(("\r\n".join(rows[:2]) + "\r" + rows[2]).encode())
  with frames.Recording(str(tmp_path / "mixed.txt")) as r:
    np.testing.assert_array_equal(r.rows(0, r.n), ys[:3])

  reads = []
  opened = array_files.fileio.open_binary

  def counted(path):
    fh = opened(path)
    read = fh.read
    fh.read = lambda n=-1: reads.append(len(got := read(n))) or got
    return fh

  monkeypatch.setattr(array_files.fileio, "open_binary", counted)
  one = tmp_path / "one.csv"
  one.write_bytes(",".join(rows[i % 4] for i in range(2000)).encode())
  with pytest.raises(InputError) as e:
    frames.Recording(str(one))
  assert str(e.value) == (
    f"{one}: one line of 416000 values; frames are rows of 208 voltages, one frame a line: "
    "write each frame on a line of its own (the file's line ends may be lost: LF, CRLF and CR "
    "are read)"
  )
  assert sum(reads) == one.stat().st_size and max(reads) <= 4096

  column = tmp_path / "column.csv"
  column.write_bytes("\n".join(v for r in rows * 50 for v in r.split(",")).encode())
  table = array_files.TextTable(str(column))
  with pytest.raises(
    InputError,
    match=r"column.csv: its first data row holds 1 value, and it "
    r"has more than 208 rows: frames must be rows of 208",
  ) as e:
    frames._text_shape(str(column), table, 208)
  assert len(table._starts) == 209 and not table._done
  table.close()
