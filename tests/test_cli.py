"""cdeit_jax.cli: the argparse commands' parsing names an unknown flag before a missing one."""

import argparse

import pytest

from cdeit_jax import cli


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="x")
  p.add_argument("--out", required=True)
  p.add_argument("--per-device-batch", type=int)
  sub = p.add_subparsers(dest="cmd")
  sub.add_parser("adjacent").add_argument("--calibrated")
  return p


def test_an_unknown_flag_is_named_before_a_missing_required_one(capsys):
  for argv in (["--bogus=1"], ["--out", "o", "--bogus"], ["adjacent", "--calibrate_typo"]):
    with pytest.raises(SystemExit) as e:
      cli.parse_args(_parser(), argv)
    assert e.value.code == 2
    assert f"unrecognized arguments: {argv[-1].split('=')[0]}" in capsys.readouterr().err
  # argparse's own parsing is kept: a unique prefix, a negative value, a subcommand's flag
  a = cli.parse_args(_parser(), ["--out", "o", "--per", "-3", "adjacent", "--calibrated", "c"])
  assert (a.out, a.per_device_batch, a.cmd, a.calibrated) == ("o", -3, "adjacent", "c")
  with pytest.raises(SystemExit):  # and its refusal of a missing one
    cli.parse_args(_parser(), [])
  assert "the following arguments are required: --out" in capsys.readouterr().err
