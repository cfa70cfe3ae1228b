"""Datasets and pipelines: conditioning against the reference fixture, validation, sharding."""

import json
import logging
import os
import pathlib
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import FIXTURES

from cdeit_jax import config_lib
from cdeit_jax.data import npz_files, pipeline, sources, stats
from cdeit_jax.eit import measurement
from cdeit_jax.eit.layout import preset

CDEIT16 = preset("cdeit16")  # CDEIT's measuring system: 16 electrodes, 208 values

UEF = pathlib.Path(__file__).parent.parent / "data" / "uef2017"


def make_folder(path, n, seed=0, **extra):
  rng = np.random.default_rng(seed)
  path.mkdir(parents=True, exist_ok=True)
  for i in range(n):
    np.savez(
      path / f"{i:05d}.npz",
      ys=rng.normal(1e-5, 1e-5, (208, 1)).astype(np.float32),
      xs=rng.uniform(-1, 1, (128, 128)).astype(np.float32),
      **extra,
    )
  return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  root = tmp_path_factory.mktemp("ds")
  make_folder(root / "train", 24)
  np.save(root / "mean.npy", np.zeros((1, 16, 13), np.float32))
  np.save(root / "std.npy", np.ones((1, 16, 13), np.float32))
  return root / "train"


def _loader(**over):
  """`config.data` with `over` (the loader settings train_dataset reads)."""
  d = config_lib.default_config().data
  d.update(over)
  return d


def test_uef2017_conditioning_matches_reference():
  ref = np.load(FIXTURES / "uef2017_conditioning.npz")
  src = sources.NpzSource(str(UEF), units="uef2017", stats=stats.authors_stats())
  assert len(src) == 22 and src.files == list(ref["files"])
  assert (src.voltage_ratio, src.current_ratio) == (
    float(ref["voltage_scale"]),
    float(ref["current_scale"]),
  )
  for i in range(22):
    ex = src[i]
    assert ex["cond"].shape == (16, 16, 1) and ex["cond"].dtype == np.float32
    np.testing.assert_allclose(ex["cond"][..., 0], ref["eim"][i, 0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(ex["voltages"], ref["voltages_normalized"][i, 0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(ex["target"][..., 0], ref["target"][i, 0], atol=1e-6, rtol=0)
    assert ex["name"] == ref["files"][i]


def test_eim_layout_by_hand():
  v = np.arange(16 * 13, dtype=np.float32).reshape(16, 13) + 1
  m = measurement.eim(v, CDEIT16)
  assert (m == 0).sum() == 48
  np.testing.assert_array_equal(m[0, 2:15], v[0])  # row 0 skips 15, 0, 1
  assert m[0, 15] == m[0, 0] == m[0, 1] == 0
  np.testing.assert_array_equal(m[5, [0, 1, 2, 3, 7]], v[5, :5])  # row 5 skips 4, 5, 6
  np.testing.assert_array_equal(m[15, 1:14], v[15])  # row 15 skips 14, 15, 0
  np.testing.assert_array_equal(measurement.from_eim(m, CDEIT16), v)  # and back


def test_presets_and_custom_ratios(folder):
  assert sources.NpzSource(str(folder), "ktc2023").voltage_ratio == 1978.0
  src = sources.NpzSource(str(folder), "mine", voltage_ratio=10.0, current_ratio=3.0)
  raw = np.load(folder / "00000.npz")["ys"].reshape(16, 13)
  np.testing.assert_allclose(src[0]["voltages"], raw / 10.0, rtol=1e-6)
  with pytest.raises(ValueError, match="unknown units 'mine'"):
    sources.NpzSource(str(folder), "mine")


def test_stats_lookup_order(folder, tmp_path, caplog):
  src = sources.NpzSource(str(folder))  # the dataset root's mean/std
  np.testing.assert_array_equal(src.std, np.ones((1, 16, 13)))
  lone = make_folder(tmp_path / "x" / "test", 2)
  ck = (np.full((1, 16, 13), 2.0), np.full((1, 16, 13), 3.0))
  src = sources.NpzSource(str(lone), checkpoint_stats=ck)  # no root stats: the checkpoint's
  np.testing.assert_array_equal(src.mean, ck[0])
  with pytest.raises(FileNotFoundError, match="no normalisation statistics"):
    sources.NpzSource(str(lone))
  with caplog.at_level(logging.WARNING):
    sources.NpzSource(str(lone), stats=str(folder.parent), checkpoint_stats=ck)
  assert "differ from the checkpoint's" in caplog.text
  # the dataset root's beside a checkpoint's: the checkpoint's, the root's named with the flag
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    src = sources.NpzSource(str(folder), checkpoint_stats=ck, stats_flag="--config.data.stats")
  np.testing.assert_array_equal(src.mean, ck[0])
  assert src.statistics.source == "checkpoint"
  assert f"--config.data.stats={folder.parent}" in caplog.text


def test_compute_stats_matches_numpy(folder, tmp_path):
  mean, std = stats.compute_stats(str(folder), progress=False)
  ys = np.stack(
    [np.load(folder / f)["ys"].astype(np.float64).reshape(208) for f in sorted(os.listdir(folder))]
  )
  np.testing.assert_allclose(mean.ravel(), ys.mean(0), rtol=1e-5)
  np.testing.assert_allclose(std.ravel(), ys.std(0, ddof=1), rtol=1e-5)
  r = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.voltage_stats", str(folder), "--out", str(tmp_path)],
    capture_output=True,
    text=True,
    cwd=pathlib.Path(__file__).parent.parent,
  )
  assert r.returncode == 0, r.stderr
  np.testing.assert_array_equal(np.load(tmp_path / "std.npy"), std)


def test_bad_files_are_named_and_skippable(tmp_path, caplog):
  d = make_folder(tmp_path / "train", 3)
  (d / "junk.npz").write_bytes(b"not a zip")
  np.savez(d / "nokey.npz", ys=np.zeros((208, 1)))
  np.savez(d / "shape.npz", ys=np.zeros((200, 1)), xs=np.zeros((128, 128)))
  np.savez(d / "nan.npz", ys=np.full((208, 1), np.nan), xs=np.zeros((128, 128)))
  # a good example's voltages x 1e30 (finite in float32) and x 1e8 (other units than the rest)
  ys = npz_files.read_npz(str(d / "00000.npz"))["ys"].astype(np.float64)
  np.savez(d / "huge.npz", ys=(ys * 1e30).astype(np.float32), xs=np.zeros((128, 128)))
  np.savez(d / "units.npz", ys=(ys * 1e8).astype(np.float32), xs=np.zeros((128, 128)))
  ok_stats = (np.zeros((1, 16, 13)), np.ones((1, 16, 13)))
  with pytest.raises(npz_files.DatasetError) as e:
    sources.NpzSource(str(d), stats=ok_stats)
  msg = str(e.value)
  assert "6 of 9 files are bad" in msg
  assert re.search(r"huge.npz: ys reaches [\d.]+e\+2\d: beyond 1e\+15, no device's voltages", msg)
  assert re.search(r"units.npz: ys reaches [\d.]+e\+03, [\d.]+e\+07 times the folder's", msg)
  assert "junk.npz: not a readable npz" in msg
  assert "nokey.npz: missing key 'xs'" in msg
  assert "shape.npz: ys has shape (200, 1), expected (208, 1)" in msg
  assert "nan.npz: ys holds 208 non-finite values" in msg
  assert "skip_bad_files" in msg
  with caplog.at_level(logging.WARNING):
    src = sources.NpzSource(str(d), stats=ok_stats, skip_bad=True)
  assert len(src) == 3 and "skipping 6 of 9 bad files" in caplog.text
  with pytest.raises(npz_files.DatasetError, match="does not exist"):
    sources.NpzSource(str(tmp_path / "nope"), stats=ok_stats)
  (tmp_path / "empty").mkdir()
  with pytest.raises(npz_files.DatasetError, match="holds no .npz files"):
    sources.NpzSource(str(tmp_path / "empty"), stats=ok_stats)


def test_epoch_lands_once_across_8_devices(folder):
  assert jax.device_count() == 8
  src = sources.NpzSource(str(folder), cache=True)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  it = iter(pipeline.train_dataset(src, global_batch=8, opts=_loader(), layout=CDEIT16))
  seen = []
  for _ in range(3):  # one epoch of 24
    b = pipeline.to_global(next(it), mesh)
    assert b["cond"].shape == (8, 16, 16, 1) and b["target"].shape == (8, 128, 128, 1)
    assert b["cond"].sharding.spec == jax.sharding.PartitionSpec("data")
    shards = sorted(b["index"].addressable_shards, key=lambda s: s.index[0].start)
    assert [s.data.shape for s in shards] == [(1,)] * 8
    assert len({s.device for s in shards}) == 8
    rows = np.asarray(b["index"])
    np.testing.assert_array_equal(np.concatenate([np.asarray(s.data) for s in shards]), rows)
    for r, i in enumerate(rows):  # each row is the example it claims to be
      np.testing.assert_array_equal(np.asarray(b["target"][r]), src[int(i)]["target"])
    seen += rows.tolist()
  assert sorted(seen) == list(range(24))
  nxt = np.asarray(next(it)["index"]).tolist()  # the next epoch is reshuffled
  assert nxt != seen[:8] and len(set(nxt)) == 8


def test_eval_covers_every_example_once_with_padding():
  idx, mask = pipeline.eval_indices(21, 8)
  assert idx.shape == (3, 8) and mask.sum() == 21
  assert sorted(idx[mask].tolist()) == list(range(21))
  assert not mask[2, 5:].any()


def test_eval_batches(folder):
  src = sources.NpzSource(str(folder))
  batches = list(pipeline.eval_batches(src, 10))
  assert len(batches) == 3 and batches[-1]["mask"].tolist() == [1] * 4 + [0] * 6
  got = np.concatenate([b["index"][b["mask"] > 0] for b in batches])
  np.testing.assert_array_equal(got, np.arange(24))


def test_iterator_state_restores_exactly(folder):
  src = sources.NpzSource(str(folder))
  it = iter(pipeline.train_dataset(src, global_batch=4, opts=_loader(seed=3), layout=CDEIT16))
  for _ in range(7):  # into the second epoch
    next(it)
  state = it.get_state()
  want = [next(it)["index"].tolist() for _ in range(5)]
  fresh = iter(pipeline.train_dataset(src, global_batch=4, opts=_loader(seed=3), layout=CDEIT16))
  fresh.set_state(json.loads(json.dumps(state)))  # the state survives JSON (checkpoints)
  assert [next(fresh)["index"].tolist() for _ in range(5)] == want


def test_augmented_rows_are_their_examples_turned_or_mirrored(folder):
  """With `augment`, each row is its example under one of the 8 symmetries: the target turned
  and the conditioning recomputed from the permuted voltages (checked against the source's own
  conditioning of those voltages); over the epochs every symmetry occurs, and a restored
  iterator draws the same ones."""
  from cdeit_jax.eit import symmetry

  src = sources.NpzSource(
    str(folder), stats=(np.full((1, 16, 13), 1e-5), np.full((1, 16, 13), 2e-5))
  )
  it = iter(pipeline.train_dataset(src, 4, _loader(seed=2, augment=True), CDEIT16))
  used = set()
  for step in range(12):  # two epochs
    if step == 7:
      state = it.get_state()
    b = next(it)
    for r, i in enumerate(b["index"]):
      ex = src[int(i)]
      raw = npz_files.read_npz(str(folder / src.files[int(i)]))["ys"][:, 0]
      hits = [
        g
        for g in symmetry.GROUP
        if np.array_equal(b["target"][r], symmetry.image(ex["target"], *g))
      ]
      assert len(hits) == 1
      used.add(hits[0])
      turned = src.condition(raw[symmetry.permutation(*hits[0], CDEIT16)])[0]
      np.testing.assert_allclose(b["cond"][r], turned, rtol=1e-5, atol=1e-6)
  assert len(used) == 8
  fresh = iter(pipeline.train_dataset(src, 4, _loader(seed=2, augment=True), CDEIT16))
  fresh.set_state(json.loads(json.dumps(state)))
  a = [next(fresh) for _ in range(5)]
  it = iter(pipeline.train_dataset(src, 4, _loader(seed=2, augment=True), CDEIT16))
  want = [next(it) for _ in range(12)][7:]
  for x, y in zip(a, want):
    np.testing.assert_array_equal(x["cond"], y["cond"])
    np.testing.assert_array_equal(x["target"], y["target"])


def test_another_devices_examples_are_augmented_with_its_own_symmetries(tmp_path):
  """A 32-electrode device's files (its values conditioned as a vector): each augmented row is
  its example's values under one of the device's 8 symmetries (`symmetry.turn`: index and sign,
  checked against the simulator in test_symmetry) with the target turned alike; a device without
  the tank's symmetries (KTC2023's: no pair closes the ring) is refused before any batch."""
  from cdeit_jax.eit import layout, symmetry

  device = layout.from_rules(32, "skip-3", measure_injecting=True, clockwise=False)
  r = device.num_values
  rng = np.random.default_rng(0)
  for i in range(8):
    np.savez(
      tmp_path / f"{i:05d}.npz",
      ys=rng.normal(0, 1e-4, (r, 1)).astype(np.float32),
      xs=rng.uniform(-1, 1, (128, 128)).astype(np.float32),
    )
  stats_ = (np.full((1, r), 1e-6, np.float32), np.full((1, r), 1e-4, np.float32))
  src = sources.NpzSource(str(tmp_path), stats=stats_, num_values=r, vector_cond=True)
  it = iter(pipeline.train_dataset(src, 4, _loader(seed=5, augment=True), device))
  used = set()
  for _ in range(6):
    b = next(it)
    for row, i in enumerate(b["index"]):
      ex = src[int(i)]
      g = next(
        g
        for g in symmetry.GROUP
        if np.array_equal(b["target"][row], symmetry.image(ex["target"], *g))
      )
      used.add(g)
      index, sign = symmetry.turn(*g, device)
      raw = npz_files.read_npz(str(tmp_path / src.files[int(i)]))["ys"][:, 0]
      np.testing.assert_allclose(b["cond"][row], src.condition(raw[index] * sign)[0], rtol=1e-6)
  assert len(used) >= 6
  with pytest.raises(ValueError, match="ktc2023.*not symmetries"):
    pipeline.train_dataset(src, 4, _loader(augment=True), layout.preset("ktc2023"))


def test_worker_processes_give_the_same_batches(folder):
  src = sources.NpzSource(str(folder))
  a = iter(pipeline.train_dataset(src, 4, _loader(seed=1), CDEIT16))
  b = iter(pipeline.train_dataset(src, 4, _loader(seed=1, num_workers=2), CDEIT16))
  for _ in range(4):
    x, y = next(a), next(b)
    np.testing.assert_array_equal(x["index"], y["index"])
    np.testing.assert_array_equal(x["cond"], y["cond"])


def test_two_processes_read_disjoint_shards(folder, tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  worker = pathlib.Path(__file__).parent / "data_worker.py"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  procs = [
    subprocess.Popen(
      [sys.executable, str(worker), str(port), str(i), str(folder), str(tmp_path / f"{i}.json")],
      env=env,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  for p in procs:
    _, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
  r = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
  assert r[0]["devices"] == 8
  a, b = set(r[0]["seen"]), set(r[1]["seen"])
  assert len(r[0]["seen"]) == len(a) == 12 and len(b) == 12
  assert not a & b and a | b == set(range(24))  # disjoint shares covering the epoch
  # the same global batches as one process reading everything (order independent of hosts)
  src = sources.NpzSource(str(folder), stats=(np.zeros((1, 16, 13)), np.ones((1, 16, 13))))
  one = iter(pipeline.train_dataset(src, global_batch=8, opts=_loader(), layout=CDEIT16))
  for k in range(3):
    seen = r[0]["seen"][4 * k : 4 * k + 4] + r[1]["seen"][4 * k : 4 * k + 4]
    assert next(one)["index"].tolist() == seen
  for shape, n_local, spec_ok, _ in r[0]["shapes"]:
    assert shape == [8, 16, 16, 1] and n_local == 4 and spec_ok
  # the collective sum over the global batch equals the sum of both hosts' local indices
  for k in range(3):
    both = sum(r[0]["seen"][4 * k : 4 * k + 4]) + sum(r[1]["seen"][4 * k : 4 * k + 4])
    assert r[0]["shapes"][k][3] == r[1]["shapes"][k][3] == both
  assert sorted(r[0]["eval"] + r[1]["eval"]) == list(range(24))
