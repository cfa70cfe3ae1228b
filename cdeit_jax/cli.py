"""Command-line plumbing shared by train.py and eval.py: one spelling of the multi-host flags, one
cluster set-up, flag parsing whose mistakes are one line, and one-line reports of the project's
own errors (`cdeit_jax.common.errors`); any other exception keeps its traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from absl import app, flags

from cdeit_jax.common import compat
from cdeit_jax.common.errors import CdeitError, InputError

FLAGS = flags.FLAGS


def define_cluster_flags() -> None:
  flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (explicit clusters)")
  flags.DEFINE_integer("num_processes", None, "number of processes (explicit clusters)")
  flags.DEFINE_integer("process_id", None, "this process's id (explicit clusters)")


def define_cache_flag() -> None:
  flags.DEFINE_string(
    "compilation_cache",
    None,
    "folder of JAX's persistent compilation cache "
    "(local or gs://; default: $JAX_COMPILATION_CACHE_DIR, else "
    "~/.cache/cdeit-jax/jax); none: off",
  )


def _auto_cluster() -> bool:
  """Multi-host environments where jax.distributed.initialize() needs no arguments."""
  env = os.environ
  return (
    len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
    or int(env.get("SLURM_NTASKS", "1")) > 1
    or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
  )


def init_distributed() -> None:
  """`jax.distributed.initialize` from the cluster flags, or by itself on TPU pods, SLURM and
  Open MPI; nothing on one host."""
  import jax

  given = [FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id]
  if any(v is not None for v in given):
    if any(v is None for v in given):
      raise app.UsageError("--coordinator_address, --num_processes and --process_id go together")
    if FLAGS.num_processes > 1 and os.environ.get("JAX_PLATFORMS", "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  elif _auto_cluster():
    jax.distributed.initialize()
  from cdeit_jax.common import logs

  logs.console(primary=jax.process_index() == 0)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a missing config file or an unknown config key reported as one
  line (ml_collections raises them, some only when the config is first read, as OSError and
  KeyError with long tracebacks); --config_help lists the config's keys and exits."""
  try:
    try:
      rest = FLAGS(argv)
    except flags.IllegalFlagValueError:
      if not _config_help_asked():  # the keys are listed without the required flags
        raise
      rest = argv[:1]
    if "config" in FLAGS and FLAGS.config is not None and not isinstance(FLAGS.config, str):
      FLAGS.config.keys()  # config_flags defers a failed load to the first access (a tool's
      # --config may be a plain path, loaded by the tool: config_lib.load)
    if not _config_help_asked():
      return rest
    listing = _config_listing()
  except flags.Error as e:
    print(f"error: {e}\nPass --help for the flags.", file=sys.stderr)
  except CdeitError as e:  # a config file's own refusal (configs/device.py without its device)
    print(f"error: {e}", file=sys.stderr)
  except OSError as e:
    path = getattr(FLAGS["config"], "config_filename", None) if "config" in FLAGS else None
    if path and not os.path.isfile(path.split(":")[0]):
      print(f"error: --config {path}: no such file (the configs are in configs/)", file=sys.stderr)
    else:
      print(f"error: --config: {' '.join(str(e).split())}", file=sys.stderr)
  except (KeyError, AttributeError) as e:  # an unknown key: config files, config dicts
    unknown_config_key(argv, e)
  else:
    try:
      print(listing, flush=True)
    except BrokenPipeError:  # `--config_help | head`: the reader has what it wanted
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  sys.exit(2)


# Whether --config_help lists a checkpoint's config (`define_checkpoint_config`'s commands: the
# run --workdir names) rather than --config's file.
_help_reads_checkpoint = False


def define_config_help(checkpoint: bool = False) -> None:
  """--config_help: list every config key with the value this command line gives it, its
  default and its meaning (`config_lib.listing`, docs/config.md), and exit; the command's
  required flags may be left out. `checkpoint`: the config is the checkpoint's of --workdir."""
  global _help_reads_checkpoint
  _help_reads_checkpoint = checkpoint
  what = "--workdir's checkpoint (else the defaults)" if checkpoint else "--config's file"
  flags.DEFINE_boolean(
    "config_help",
    False,
    f"list every config key with its value in {what} and the --config.KEY given, its default "
    "and meaning (docs/config.md), and exit",
    flag_values=FLAGS,
  )


def _config_help_asked() -> bool:
  return "config_help" in FLAGS and FLAGS.is_parsed() and bool(FLAGS.config_help)


def _config_listing() -> str:
  """`config_lib.listing` of the config this command line gives."""
  from cdeit_jax import config_lib

  cfg = FLAGS.config if "config" in FLAGS else None
  given = checkpoint_overrides() if cfg is not None else {}
  changed = " ".join(f"--config.{k}={v}" for k, v in given.items())
  if _help_reads_checkpoint and "workdir" in FLAGS and FLAGS.workdir:
    from cdeit_jax.infer import run_opening

    cfg = run_opening.config_of(FLAGS.workdir, given)
    source = f"the checkpoint of --workdir {FLAGS.workdir}"
  elif not _help_reads_checkpoint and cfg is not None:
    source = f"--config {FLAGS['config'].config_filename}"
  else:
    source = "the defaults" if given else ""
  return config_lib.listing(cfg, f"{source} with {changed}" if changed else source)


def define_checkpoint_config(examples: str) -> None:
  """--config of the commands that read a checkpoint (eval.py, reconstruct): the checkpoint's
  config, changed key by key (`examples` shows some); an unknown --config.KEY is one line."""
  from ml_collections import config_flags

  from cdeit_jax import config_lib

  try:
    config_flags.DEFINE_config_dict(
      "config",
      config_lib.default_config(),
      f"settings: the checkpoint's config, changed with {examples}, ...",
      lock_config=True,
    )
  except (KeyError, AttributeError) as e:  # an unknown --config.KEY on the command line
    unknown_config_key(sys.argv, e)
  define_config_help(checkpoint=True)


def checkpoint_overrides() -> dict:
  """The `--config.KEY=VALUE` pairs given to a command of `define_checkpoint_config`."""
  from ml_collections import config_flags

  return dict(config_flags.get_override_values(FLAGS["config"]))


def unknown_config_key(argv: list[str], e: Exception) -> None:
  """Report the unknown `--config.KEY`s of `argv` in one line, each with the key it most likely
  meant, and exit 2 (`DEFINE_config_dict` meets one when the flag is defined,
  `DEFINE_config_file` when the flags are parsed; either names only the first, without its
  path)."""
  from cdeit_jax import config_lib

  keys = [a.split("=")[0][len("--config.") :] for a in argv[1:] if a.startswith("--config.")]
  bad = config_lib.unknown_keys(_config_of(argv), keys)
  if not bad:  # not a key of the config given (a config file's own failure): the library's text
    arg = e
    while isinstance(arg, BaseException) and arg.args:  # AttributeError(KeyError(text))
      arg = arg.args[0]
    bad = [f"--config: {' '.join(str(arg).split())}"]
  print(f"error: {'; '.join(bad)}", file=sys.stderr)
  sys.exit(2)


def _config_of(argv: list[str]):
  """The config a command line's `--config FILE` gives (its keys are the ones known), else the
  default tree (`define_checkpoint_config`'s commands, a file that does not load)."""
  from cdeit_jax import config_lib

  path = None
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      path = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      path = argv[i + 1]
  try:
    return config_lib.load(path) if path else config_lib.default_config()
  except Exception:  # its own error is reported where the command loads it
    return config_lib.default_config()


class _QuietDiskFull(logging.Filter):
  """Drop a library's log records of a full disk: orbax logs each failed asynchronous write with
  its traceback, and asyncio each of its writes' unretrieved errors, hundreds of lines per failed
  save. The command reports the full disk once, in one line (`fileio.no_space`), and keeps the
  error it caught in the debug log."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    text = record.getMessage()
    return not ((exc is not None and compat.is_disk_full(exc)) or compat.NO_SPACE in text)


def _quiet_closed_loop_callbacks() -> None:
  """When an asynchronous checkpoint save fails (a full disk), orbax closes its event loop while
  TensorStore still holds callbacks into it; each then reports `RuntimeError: Event loop is
  closed` as an unraisable error with its traceback. Those are dropped: the command reports the
  failure itself, once."""
  default = sys.unraisablehook

  def hook(unraisable):
    value = unraisable.exc_value
    if not compat.is_closed_loop(value):
      default(unraisable)

  sys.unraisablehook = hook


def check_bucket_credentials() -> None:
  """A gs:// path given (a flag, or --config's data.path) without Google credentials is one line
  naming it now, not a minute of retries and tracebacks at its first use. A local GCS server
  (STORAGE_EMULATOR_HOST, as the tests run) needs none."""
  given = [(f"--{n}", FLAGS[n].value) for n in FLAGS if isinstance(FLAGS[n].value, str)]
  cfg = FLAGS["config"].value if "config" in FLAGS else None
  data_path = getattr(getattr(cfg, "data", None), "path", None)
  if isinstance(data_path, str):
    given.append(("--config.data.path", data_path))
  remote = [(flag, v) for flag, v in given if v.startswith(("gs://", "gcs://"))]
  if not remote or os.environ.get("STORAGE_EMULATOR_HOST"):
    return
  flag, value = remote[0]
  try:
    import google.auth
    import google.auth.exceptions
  except ImportError:
    raise InputError(
      f"{flag} {value}: gs:// paths need the gcs extra: pip install -e '.[gcs]'"
    ) from None
  try:
    google.auth.default()
  except google.auth.exceptions.DefaultCredentialsError:
    raise InputError(
      f"{flag} {value}: no Google credentials for gs:// (none in GOOGLE_APPLICATION_CREDENTIALS, "
      "gcloud's application-default login or a VM's service account): run `gcloud auth "
      "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
    ) from None


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with one-line flag errors and one-line reports of our own errors."""

  from cdeit_jax.common import libtpu_env

  # libtpu's settings on a machine without a TPU, before JAX starts its backends (the commands
  # that re-execute through cpu_tuning.apply have them already; the others get them here)
  libtpu_env.apply()

  def wrapped(argv):
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO
    for name in ("absl", "asyncio"):  # orbax's logs; its failed writes' unretrieved tasks
      logging.getLogger(name).addFilter(_QuietDiskFull())
    _quiet_closed_loop_callbacks()
    for name in ("gcsfs", "fsspec"):  # and every file they open
      logging.getLogger(name).setLevel(logging.WARNING)
    try:
      check_bucket_credentials()
      if "compilation_cache" in FLAGS:
        from cdeit_jax.common import compile_cache

        compile_cache.enable(FLAGS.compilation_cache)
      main(argv)
    except KeyboardInterrupt as e:  # our Interrupted (a run that saved and stopped) or Ctrl-C
      print(
        f"{e}"
        if isinstance(e, CdeitError)
        else "interrupted: every output is written "
        "whole or not at all; rerun the same command to resume (train.py) or redo the rest",
        file=sys.stderr,
      )
      sys.stdout.flush()
      sys.stderr.flush()
      # Not sys.exit: a library's worker threads (an orbax save cut short) may wait forever
      # for the interrupted main thread, and the interpreter would wait for them.
      os._exit(130)
    except CdeitError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)

  app.run(wrapped, flags_parser=parse_flags)


def parse_args(
  parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> argparse.Namespace:
  """argparse's parsing for the argparse commands, an unknown flag named first: argparse reports
  a missing required flag before an unknown one, which blames the flag the user did not mistype."""
  argv = sys.argv[1:] if argv is None else list(argv)
  known = _options(parser)
  unknown = [
    name
    for name in (a.split("=", 1)[0] for a in argv if a.startswith("--") and a != "--")
    if not any(k.startswith(name) for k in known)  # argparse takes a flag's unique prefix too
  ]
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  return parser.parse_args(argv)


def _options(parser: argparse.ArgumentParser) -> set[str]:
  """Every option string `parser` and its subcommands take (argparse keeps them in private
  fields, unchanged since Python 3.2; no public API lists them)."""
  names = set(parser._option_string_actions)
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        names |= _options(sub)
  return names
