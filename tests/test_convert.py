"""Strict import/export of reference state dicts and the convert command."""

import json
import sys

import numpy as np
import pytest
from conftest import FIXTURES, TINY, system_of
from flax import nnx

from cdeit_jax import config_lib, convert
from cdeit_jax.checkpoints import checkpoint, loading
from cdeit_jax.convert import StateDictMismatch, export_torch_state_dict, load_torch_state_dict
from cdeit_jax.data import stats
from cdeit_jax.model.layers import relative_position_index, sincos_pos_embed_2d
from cdeit_jax.model.network import CDEIT, count_params


def test_export_round_trips_reference_state_dict(small_model, small_state_dict):
  out = export_torch_state_dict(small_model)
  assert set(out) == set(small_state_dict)
  for k, v in small_state_dict.items():
    assert out[k].shape == v.shape, k
    np.testing.assert_array_equal(out[k], v, err_msg=k)


def test_full_published_state_dict_loads():
  shapes = json.loads((FIXTURES / "dit_full_state_dict_shapes.json").read_text())
  rng = np.random.default_rng(0)
  sd = {}
  for k, s in shapes.items():
    if k.endswith("relative_position_index"):
      sd[k] = relative_position_index(int(np.sqrt(s[0])))  # (w*w, w*w)
    elif k == "pos_embed":  # the fixed sin-cos table (checked on import, not loaded)
      sd[k] = sincos_pos_embed_2d(s[2], int(np.sqrt(s[1])))[None]
    else:
      sd[k] = (
        rng.standard_normal(s).astype(np.float32)
        if np.prod(s) < 10_000
        else np.full(s, 0.5, np.float32)
      )
  model = load_torch_state_dict(CDEIT(system=system_of(), rngs=nnx.Rngs(0)), sd)
  assert count_params(model) == 109_719_108
  back = export_torch_state_dict(model)
  assert set(back) == set(shapes)
  for k in shapes:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)


def test_mismatches_are_all_listed(small_state_dict):
  sd = dict(small_state_dict)
  del sd["blocks.mid.attn.qkv.bias"]
  sd["blocks.mid.extra.weight"] = np.zeros(3)
  sd["final_layer.linear.weight"] = np.zeros((4, 65), np.float32)
  with pytest.raises(StateDictMismatch) as e:
    load_torch_state_dict(CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0)), sd)
  msg = str(e.value)
  assert "missing keys (1)" in msg and "blocks.mid.attn.qkv.bias" in msg
  assert "unexpected keys (1)" in msg and "blocks.mid.extra.weight" in msg
  assert "shape mismatches (1)" in msg and "final_layer.linear.weight: checkpoint (4, 65)" in msg


def test_tensors_that_are_not_weights_are_refused(small_state_dict):
  """A NaN weight, an integer, a boolean or a string tensor: each named, nothing cast."""
  sd = dict(small_state_dict)
  sd["blocks.mid.attn.qkv.bias"] = np.where(
    np.arange(sd["blocks.mid.attn.qkv.bias"].size) == 3, np.nan, sd["blocks.mid.attn.qkv.bias"]
  )
  sd["final_layer.linear.bias"] = sd["final_layer.linear.bias"].astype(np.int64)
  sd["t_embedder.mlp.0.bias"] = sd["t_embedder.mlp.0.bias"] > 0
  with pytest.raises(StateDictMismatch) as e:
    load_torch_state_dict(CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0)), sd)
  msg = str(e.value)
  assert "not floating point (2)" in msg and "final_layer.linear.bias: int64" in msg
  assert "t_embedder.mlp.0.bias: bool" in msg
  assert "non-finite values (1)" in msg and "blocks.mid.attn.qkv.bias: 1 NaN" in msg
  with pytest.raises(ValueError, match="step -1: must be an integer >= 0"):
    checkpoint.save_inference(
      "/nonexistent",
      CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0)),
      config_lib.default_config(),
      mean=np.zeros(208),
      std=np.ones(208),
      step=-1,
    )


def test_wrong_width_is_reported(small_state_dict):
  with pytest.raises(StateDictMismatch, match="hidden_size=512"):
    load_torch_state_dict(
      CDEIT(system=system_of(), hidden_size=512, rngs=nnx.Rngs(0)), small_state_dict
    )


def test_bad_index_buffer_is_reported(small_state_dict):
  sd = dict(small_state_dict)
  key = "blocks.swinOut2.attn.attn.relative_position_index"
  sd[key] = sd[key][::-1].copy()
  with pytest.raises(StateDictMismatch, match="bad fixed tables"):
    load_torch_state_dict(CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0)), sd)


def test_changed_position_table_is_reported(small_state_dict):
  sd = dict(small_state_dict)
  sd["pos_embed"] = sd["pos_embed"] + np.float32(1e-3)
  with pytest.raises(StateDictMismatch, match="pos_embed: differs from the sin-cos table"):
    load_torch_state_dict(CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0)), sd)


def test_failed_load_leaves_model_untouched(small_state_dict):
  model = CDEIT(system=system_of(), hidden_size=64, rngs=nnx.Rngs(0))
  before = np.asarray(model.mid.attn.qkv.kernel[...]).copy()
  sd = dict(small_state_dict)
  del sd["pos_embed"]
  with pytest.raises(StateDictMismatch):
    load_torch_state_dict(model, sd)
  np.testing.assert_array_equal(np.asarray(model.mid.attn.qkv.kernel[...]), before)


def test_convert_writes_loadable_checkpoint(tmp_path):
  cfg = config_lib.default_config()
  cfg.model.hidden_size = 64  # the fixture's model
  convert.convert(str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(tmp_path / "run"))
  model, meta = loading.load(str(tmp_path / "run"))
  # The weights come back bit for bit (the forward of these weights is checked in test_model).
  reference = dict(np.load(FIXTURES / "dit_small_state_dict.npz"))
  for k, v in export_torch_state_dict(model).items():
    np.testing.assert_array_equal(v, reference[k], err_msg=k)
  mean, std = checkpoint.meta_stats(meta)
  a_mean, a_std = stats.authors_stats()
  np.testing.assert_array_equal(mean, a_mean)
  np.testing.assert_array_equal(std, a_std)
  assert meta["weights"] == ["ema"] and meta["model"]["hidden_size"] == 64
  with pytest.raises(ValueError, match="--config.eval.weights=ema"):
    loading.load(str(tmp_path / "run"), weights="raw")
  for step in (0, 5):  # the same step, or any other: a workdir holds one model
    with pytest.raises(ValueError, match=r"holds a model already \(checkpoints/ has step 0,"):
      convert.convert(
        str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(tmp_path / "run"), step=step
      )
  (tmp_path / "run" / "metrics.jsonl").write_text("")  # as train.py's workdirs hold
  with pytest.raises(ValueError, match="is a training run's .* give a new --workdir"):
    convert.convert(str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(tmp_path / "run"), step=5)


@pytest.mark.parametrize(
  "edit, match",
  [
    (lambda m: m["stats"].update(mean="oops"), "stats must hold the lists mean and std"),
    (lambda m: m["model"].update(hidden_size="64"), "its config does not fit this version's"),
    (lambda m: m.update(step="7"), "step is '7', the folder says 0"),
    (lambda m: m.update(config=[1]), "config is a list, not a mapping"),
  ],
)
def test_edited_metadata_is_one_line(tmp_path, edit, match):
  """Metadata edited to wrong types is refused when read, before any sampling."""
  import json

  cfg = config_lib.default_config()
  cfg.model.hidden_size = 64
  convert.convert(str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(tmp_path / "run"))
  path = tmp_path / "run" / "checkpoints" / "0" / "meta" / "metadata"
  meta = json.loads(path.read_text())
  edit(meta)
  path.write_text(json.dumps(meta))
  with pytest.raises(checkpoint.CheckpointError, match=match):
    loading.load(str(tmp_path / "run"))


@pytest.mark.e2e
def test_convert_command_line(tmp_path):
  import subprocess

  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "cdeit_jax.convert",
      "--config",
      "configs/default.py",
      "--config.model.hidden_size=64",
      "--checkpoint",
      str(FIXTURES / "dit_small_state_dict.npz"),
      "--workdir",
      str(tmp_path / "run"),
    ],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 0, r.stderr
  assert checkpoint.read_meta(str(tmp_path / "run"))["model"]["hidden_size"] == 64
  assert "tracked_metric" not in r.stderr  # orbax's warning of a best-metric manager
  run = lambda sd, out: subprocess.run(
    [sys.executable, "-m", "cdeit_jax.convert", "--config", "configs/default.py",
     "--checkpoint", sd, "--workdir", str(tmp_path / out)],
    capture_output=True,
    text=True,
  )  # fmt: skip
  r = run(str(FIXTURES / "dit_small_state_dict.npz"), "b")  # the config's hidden_size is 512
  assert r.returncode == 0, r.stderr
  assert "model sizes from its shapes: hidden_size=64 (the config's 512)" in r.stdout
  sd = dict(np.load(FIXTURES / "dit_small_state_dict.npz"))
  del sd["final_layer.linear.bias"]
  np.savez(tmp_path / "cut.npz", **sd)
  r = run(str(tmp_path / "cut.npz"), "c")
  assert r.returncode == 1 and "missing keys (1)" in r.stderr, r.stderr
  assert "--config.model.hidden_size=64" in r.stderr  # the sizes its shapes give, as flags
  assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr  # our error: a report


def test_missing_checkpoint_paths_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file"):
    convert.read_state_dict(str(tmp_path / "nope.pt"))
  (tmp_path / "bad.npz").write_bytes(b"not a zip")
  with pytest.raises(ValueError, match="bad.npz"):
    convert.read_state_dict(str(tmp_path / "bad.npz"))
  with pytest.raises(FileNotFoundError, match="checkpoints/"):
    loading.load(str(tmp_path))


def test_pt_without_torch_says_how_to_install(tmp_path, monkeypatch):
  """Without torch: a zip (what torch.save writes) needs it, said in one line; a file that is no
  checkpoint at all is named as such first."""
  import zipfile

  with zipfile.ZipFile(tmp_path / "best.pt", "w") as z:
    z.writestr("archive/data.pkl", b"")
  (tmp_path / "notes.pt").write_text("not a checkpoint")
  monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
  with pytest.raises(
    ValueError, match=r"best.pt needs PyTorch: pip install 'cdeit-jax\[torch\]'"
  ) as e:
    convert.read_state_dict(str(tmp_path / "best.pt"))
  # the CPU build's index, and the .npz recipe (which needs no torch here)
  assert "--index-url https://download.pytorch.org/whl/cpu" in str(e.value)
  assert convert.NPZ_RECIPE in str(e.value)
  with pytest.raises(ValueError, match=r"notes.pt: not a PyTorch checkpoint \(neither a zip"):
    convert.read_state_dict(str(tmp_path / "notes.pt"))


def test_pt_files_as_the_authors_save_them(tmp_path, small_state_dict):
  torch = pytest.importorskip("torch")
  tensors = {k: torch.from_numpy(v) for k, v in small_state_dict.items()}
  torch.save({"model": tensors, "opt": {}, "args": None}, tmp_path / "best.pt")
  torch.save(tensors, tmp_path / "bare.pt")
  for name in ("best.pt", "bare.pt"):
    sd = convert.read_state_dict(str(tmp_path / name))
    assert set(sd) == set(small_state_dict)
    np.testing.assert_array_equal(sd["pos_embed"], small_state_dict["pos_embed"])


def _sizes_model(**sizes):
  """A CDEIT of these sizes, its shapes only (no weights computed: 1-2 s, not 10-30)."""
  return nnx.eval_shape(lambda: CDEIT(system=system_of(), rngs=nnx.Rngs(0), **sizes))


def test_sizes_from_shapes_are_the_models():
  """The sizes read off a state dict's shapes are those its model was built with (the hand
  truth: the constructor's arguments), and the published ones from its shapes (cdeit-model.md:
  image 128, patch 2, width 512, 16 heads, MLP 4x, 4 scales, 256 frequencies)."""
  built = dict(
    image_size=32,
    patch_size=2,
    in_channels=1,
    hidden_size=24,
    num_heads=3,
    mlp_ratio=2.0,
    num_scales=2,
    window_size=8,  # not the default quarter of the 16-token grid
    freq_dim=32,
  )
  assert convert.sizes_of(convert.reference_shapes(_sizes_model(**built))) == built
  quarter = {**built, "window_size": None}  # a quarter of the grid: the default
  assert convert.sizes_of(convert.reference_shapes(_sizes_model(**quarter))) == quarter
  # a model's exported state dict, computed (reference_shapes is its shapes)
  tiny = CDEIT(system=system_of(), rngs=nnx.Rngs(0), **TINY)
  shapes = {k: v.shape for k, v in export_torch_state_dict(tiny).items()}
  assert shapes == convert.reference_shapes(tiny)
  assert convert.sizes_of(shapes) == {
    **dict(in_channels=1, mlp_ratio=4.0, window_size=None, freq_dim=256),
    **TINY,
  }
  published = json.loads((FIXTURES / "dit_full_state_dict_shapes.json").read_text())
  assert convert.sizes_of(published) == dict(
    image_size=128,
    patch_size=2,
    in_channels=1,
    hidden_size=512,
    num_heads=16,
    mlp_ratio=4.0,
    num_scales=4,
    window_size=None,
    freq_dim=256,
  )


def test_mismatch_names_the_flags_with_the_checkpoints_values(small_state_dict):
  """The fixture (hidden 64, 16 heads, 4 scales, image 128) into a tiny model: the message
  gives the flags that build its model, each with the fixture's value."""
  with pytest.raises(StateDictMismatch) as e:
    load_torch_state_dict(_sizes_model(**TINY), small_state_dict)
  last = str(e.value).splitlines()[-1]
  for flag in (
    "--config.model.image_size=128",
    "--config.model.hidden_size=64",
    "--config.model.num_heads=16",
    "--config.model.num_scales=4",
  ):
    assert flag in last, (flag, last)
  assert "patch_size" not in last  # the same in both: not a flag to change
  assert "window_size" not in last  # a quarter of the grid in both
  sd = dict(small_state_dict)
  del sd["blocks.mid.attn.qkv.bias"]  # same sizes, a key missing: said so
  with pytest.raises(StateDictMismatch, match="give this model's sizes"):
    load_torch_state_dict(_sizes_model(hidden_size=64), sd)


def test_convert_takes_the_sizes_from_the_checkpoint(tmp_path, capsys, caplog):
  """The config's sizes are the tiny model's; the checkpoint's shapes win, and a line says so.
  The imported step has no validation loss: saved by a manager that tracks none (orbax warned
  'Requested `tracked_metric`; did not provide metrics.' at every convert)."""
  import logging

  cfg = config_lib.default_config()
  cfg.model.update(TINY)
  with caplog.at_level(logging.WARNING):
    convert.convert(str(FIXTURES / "dit_small_state_dict.npz"), cfg, str(tmp_path / "run"))
  assert not [r for r in caplog.records if "tracked_metric" in r.getMessage()]
  out = capsys.readouterr().out
  assert "model sizes from its shapes: image_size=128 (the config's 32)" in out
  assert "hidden_size=64 (the config's 32), num_heads=16 (the config's 4)" in out
  model, meta = loading.load(str(tmp_path / "run"))
  assert meta["model"]["hidden_size"] == 64 and meta["model"]["num_heads"] == 16
  assert meta["weights"] == ["ema"]
  assert cfg.model.hidden_size == 32  # the caller's config is left as it was
  reference = dict(np.load(FIXTURES / "dit_small_state_dict.npz"))
  for k, v in export_torch_state_dict(model).items():
    np.testing.assert_array_equal(v, reference[k], err_msg=k)


def _layouts(torch, ema, raw):
  """A checkpoint as each known writer saves one: {file name: (object, weight set: the state
  dict --weights ema and --weights raw read from it)}."""
  import argparse

  t = lambda sd, prefix="": {prefix + k: torch.from_numpy(v) for k, v in sd.items()}
  return {
    # the authors' main.py: {"model": ema.ema_model.state_dict(), "epoch": epoch}
    "authors.pt": ({"model": t(ema), "epoch": 41}, ema, ema),
    # DiT's train.py: raw and EMA weights, the optimizer's state and the arguments
    "dit.pt": (
      {"model": t(raw), "ema": t(ema), "opt": {"state": {}}, "args": argparse.Namespace(lr=1e-4)},
      ema,
      raw,
    ),
    "bare.pt": (t(ema), ema, ema),
    "ddp.pt": ({"model": t(ema, "module.")}, ema, ema),  # DistributedDataParallel's prefix
    "ema_pytorch.pt": (  # an ema_pytorch.EMA's own state dict
      {
        "initted": torch.tensor(True),
        "step": torch.tensor(1000),
        **t(ema, "ema_model."),
        **t(raw, "online_model."),
      },
      ema,
      raw,
    ),
  }


def test_best_pt_layouts_import_their_weight_sets(tmp_path, small_state_dict):
  """Each writer's layout gives the weight set asked for, equal to its plain state dict; the
  authors' best.pt converts to the same weights as the plain .npz of its state dict."""
  torch = pytest.importorskip("torch")
  ema = small_state_dict
  raw = {k: (v + np.float32(1)) if v.dtype.kind == "f" else v for k, v in ema.items()}
  raw["pos_embed"] = ema["pos_embed"]
  for name, (obj, want_ema, want_raw) in _layouts(torch, ema, raw).items():
    torch.save(obj, tmp_path / name)
    for weights, want in (("ema", want_ema), ("raw", want_raw)):
      sd = convert.read_state_dict(str(tmp_path / name), weights)
      assert set(sd) == set(want), (name, weights)
      for k in want:
        np.testing.assert_array_equal(sd[k], want[k], err_msg=f"{name} {weights} {k}")
  assert (
    "EMA weights, as the authors' main.py saves them"
    in convert.read_checkpoint(str(tmp_path / "authors.pt"))[1]
  )
  half = {"model": {k: torch.from_numpy(v).half() for k, v in ema.items() if v.dtype.kind == "f"}}
  torch.save(half, tmp_path / "half.pt")  # float16 weights come back as float32
  got = convert.read_state_dict(str(tmp_path / "half.pt"))
  assert got["x_embedder.proj.weight"].dtype == np.float32
  np.testing.assert_array_equal(
    got["x_embedder.proj.weight"], ema["x_embedder.proj.weight"].astype(np.float16)
  )
  cfg = config_lib.default_config()  # hidden 512: the sizes come from the file
  convert.convert(str(tmp_path / "authors.pt"), cfg, str(tmp_path / "run"))
  got = export_torch_state_dict(loading.load(str(tmp_path / "run"))[0])
  for k in ema:  # as the plain state dict's import is (test_convert_writes_loadable_checkpoint)
    np.testing.assert_array_equal(got[k], ema[k], err_msg=k)


def test_npz_recipe_of_the_docs_imports_equal(tmp_path, small_state_dict, monkeypatch):
  """The one-line recipe docs/from_pytorch.md gives (convert.NPZ_RECIPE, run as written) makes
  an .npz of each layout's default weights, which reads without torch equal to the state dict."""
  import pathlib
  import shlex
  import subprocess

  torch = pytest.importorskip("torch")
  doc = (pathlib.Path(__file__).parents[1] / "docs" / "from_pytorch.md").read_text()
  assert convert.NPZ_RECIPE in doc
  raw = {k: v + np.float32(1) if v.dtype.kind == "f" else v for k, v in small_state_dict.items()}
  for name, (obj, want, _) in _layouts(torch, small_state_dict, raw).items():
    if name in ("ema_pytorch.pt", "ddp.pt"):
      continue  # the recipe is for a best.pt's layouts, not a wrapper's own state dict
    folder = tmp_path / name
    folder.mkdir()
    # torch.load (2.6 and later) refuses DiT's `args` (an argparse.Namespace): the docs say so
    torch.save({k: v for k, v in obj.items() if k != "args"}, folder / "best.pt")
    r = subprocess.run(
      [sys.executable if a == "python" else a for a in shlex.split(convert.NPZ_RECIPE)],
      cwd=folder,
      capture_output=True,
      text=True,
    )
    assert r.returncode == 0, r.stderr
    with monkeypatch.context() as m:
      m.setitem(sys.modules, "torch", None)  # read without torch
      sd = convert.read_state_dict(str(folder / "best.npz"))
    assert set(sd) == set(want)
    for k in want:
      np.testing.assert_array_equal(sd[k], want[k], err_msg=f"{name} {k}")
      assert sd[k].dtype == want[k].dtype, (name, k)
