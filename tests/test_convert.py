"""Strict import/export of reference state dicts and the convert command."""

import json
import sys

import numpy as np
import pytest
from conftest import FIXTURES, system_of
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
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "cdeit_jax.convert",
      "--config",
      "configs/default.py",
      "--checkpoint",
      str(FIXTURES / "dit_small_state_dict.npz"),
      "--workdir",
      str(tmp_path / "b"),
    ],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 1 and "missing keys" not in r.stderr and "shape mismatches" in r.stderr
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
  with pytest.raises(ValueError, match=r"best.pt needs PyTorch: pip install 'cdeit-jax\[torch\]'"):
    convert.read_state_dict(str(tmp_path / "best.pt"))
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
