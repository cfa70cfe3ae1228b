"""The demo's table: CDEIT against its two floors, by hand-made metrics.json files."""

import json
import pathlib
import subprocess
import sys

from cdeit_jax.infer import evaluation_table


def _write(folder, cdeit, tik, empty):
  folder.mkdir()
  m = {
    "metrics": {"cdeit": cdeit, "tikhonov": tik, "empty": empty},
    "settings": {"data": "uef2017", "examples": 22},
  }
  (folder / "metrics.json").write_text(json.dumps(m))
  return str(folder)


def _m(rmse, psnr, cc=None):
  d = {"rmse": rmse, "psnr": psnr, "ssim": 0.8, "ssim_disk": 0.7}
  if cc is not None:
    d["cc"] = cc
  return d


def test_table_and_verdict(tmp_path, capsys):
  good = _write(tmp_path / "good", _m(0.15, 21.0, 0.80), _m(0.17, 20.0, 0.74), _m(0.26, 16.7))
  text, ok = evaluation_table.table([good])
  assert ok
  assert "| good: uef2017 (22) | CDEIT | 0.1500 | 21.00 | 0.800 | 0.700 | 0.800 |" in text
  assert "- good: CDEIT's RMSE 11.8 % under Tikhonov's" in text  # 1 - 0.15 / 0.17
  assert "|  | empty image | 0.2600 | 16.70 | 0.800 | 0.700 | - |" in text
  # worse than Tikhonov in CC alone is a failure
  worse_cc = _write(tmp_path / "cc", _m(0.15, 21.0, 0.73), _m(0.17, 20.0, 0.74), _m(0.26, 16.7))
  assert not evaluation_table.table([good, worse_cc])[1]
  # an empty image with a better PSNR is a failure
  worse_empty = _write(tmp_path / "e", _m(0.15, 16.0, 0.80), _m(0.17, 15.0, 0.74), _m(0.26, 16.7))
  assert not evaluation_table.table([worse_empty])[1]
  r = subprocess.run(
    [sys.executable, "-m", "cdeit_jax.report", str(tmp_path / "missing")],
    capture_output=True,
    text=True,
    cwd=pathlib.Path(__file__).parent.parent,
  )
  assert r.returncode == 2 and "missing/metrics.json" in r.stderr and "Traceback" not in r.stderr
