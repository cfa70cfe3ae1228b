"""One command proves an accelerator: the mission's figures from one run, on whatever JAX sees.

  make accelerator-check OUT=DIR        # python -m cdeit_jax.accelerator_check --out DIR

Sections, each recorded on its own (a section that fails is kept as its error and the others
still run, so a short GPU loan always gives what it can):
- `train`: the train step (`cdeit_jax.train.step_rate`, as bench/bench_train.py) of the
  platform's config: the published size in bfloat16 on accelerators (configs/gpu.py on a GPU,
  configs/v5e8.py on a TPU), the test config's tiny model on a CPU (--config to choose);
  samples/s, TFLOP/s per device (every loop iteration counted), the fraction of the vendor's
  bf16 peak or, on a CPU, of the machine's float32 matmul rate timed in the same run, the
  attention backend, global batch, peak memory.
- `numerics`: the loss and gradients of one batch of real UEF2017 data in bfloat16 against
  float32 on the same weights, noise and timesteps (`bf16_vs_f32_loss_rel`,
  `bf16_vs_f32_grad_cos`); the platform's attention backend against XLA's on the same bfloat16
  inputs (`attention_max_abs_err`).
- `sampling` and `reconstruct`: a Reconstructor of the config's model (random weights, saved as
  an inference checkpoint under OUT/model) on UEF2017's 22 frames repeated to 64: images/s
  (K samples a frame) and frames/s, after compilation.
- `resume`: train.py with the test config, straight, and killed by SIGTERM part-way then resumed:
  `exact` when the resumed run's final EMA weights and every logged loss equal the straight run's.

Writes OUT/accelerator_check.json after every section (each time whole or not at all, so a run
cut short leaves the sections it finished) and prints a table; exits 1 when a section failed or
a bar is missed (loss within 5 %, gradient cosine 0.99, attention 0.02, exact resume).
`--budget-s`: a section is started only while that many seconds have not passed since the start;
the ones left are recorded as skipped, with the reason (`make gpu-run` gives it 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host
import signal
import subprocess
import sys
import time
import traceback

# the checkout: its configs/, data/uef2017 and train.py
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from cdeit_jax.common import cpu_tuning  # noqa: E402

if __name__ == "__main__":
  cpu_tuning.apply()  # as train.py and eval.py run (may re-execute this command once)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

CONFIGS = {"gpu": "configs/gpu.py", "tpu": "configs/v5e8.py", "cpu": "configs/test.py"}
SECTIONS = ("train", "numerics", "sampling", "resume")  # in the order they run
BARS = {"loss_rel": 0.05, "grad_cos": 0.99, "attention": 0.02}
RESUME = ["--config.steps=24", "--config.log_every=2", "--config.eval_every=8"]
KILL_AFTER = 10  # the killed run gets SIGTERM once this step is logged


def platform_info() -> dict:
  d = jax.devices()[0]
  import jaxlib

  return {
    "platform": d.platform,
    "device_kind": d.device_kind,
    "devices": jax.device_count(),
    "processes": jax.process_count(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "python": host.python_version(),
  }


def load_config(path: str | None, platform: str):
  from cdeit_jax import config_lib

  return config_lib.load(os.path.join(REPO, path or CONFIGS.get(platform, CONFIGS["cpu"])))


def train(cfg, per_device_batch: int, steps: int) -> dict:
  from cdeit_jax.train import step_rate

  return step_rate.measure(cfg, per_device_batch, steps=steps)


def _uef_batch(n: int = 8) -> dict:
  """`n` real examples: UEF2017's voltages as the model's condition, their true images."""
  from cdeit_jax.data import sources

  src = sources.NpzSource(os.path.join(REPO, "data", "uef2017"), "uef2017", "authors")
  exs = [src[i % len(src)] for i in range(n)]
  return {k: np.stack([e[k] for e in exs]) for k in ("cond", "target")}


def _perturbed(tree, scale: float = 0.05):
  """`tree` plus Gaussian noise of std `scale` (a fixed seed): a fresh CDEIT's last layer is
  zero, so its output, and the loss's dependence on its compute dtype, would be nil."""
  rng = np.random.default_rng(3)
  return jax.tree.map(lambda a: a + scale * rng.standard_normal(a.shape).astype(a.dtype), tree)


def numerics(cfg, platform: str) -> dict:
  """bfloat16 against float32: one batch's loss and gradients on the same weights; the
  platform's attention against XLA's."""
  from flax import nnx

  from cdeit_jax.checkpoints import loading
  from cdeit_jax.common import sharding as shd
  from cdeit_jax.model import attention
  from cdeit_jax.train import training

  mesh = shd.make_mesh(jax.devices()[:1])
  batch = _uef_batch()
  key_t, key_n = jax.random.split(jax.random.key(0))
  t = jax.random.randint(key_t, (len(batch["target"]),), 0, cfg.diffusion.num_steps)
  noise = jax.random.normal(key_n, batch["target"].shape, jnp.float32)
  out, params = {}, None
  for dtype in ("float32", "bfloat16"):
    c = cfg.copy_and_resolve_references()
    c.model.dtype, c.batch_size, c.accum_steps = dtype, len(batch["target"]), 1
    ts = training.setup(c, loading.resolve(c), mesh)
    if params is None:  # float32 weights for both, made non-zero (a fresh model predicts 0)
      params = _perturbed(ts.state.params)

    def loss(p, ts=ts):
      model = nnx.merge(ts.graphdef, p, ts.constants)
      return ts.diffusion.loss(model, batch["target"], t, batch["cond"], noise)

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    out[dtype] = (float(value), np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)]))
  (l32, g32), (l16, g16) = out["float32"], out["bfloat16"]
  g32, g16 = g32.astype(np.float64), g16.astype(np.float64)
  cos = float(g32 @ g16 / (np.linalg.norm(g32) * np.linalg.norm(g16)))
  # attention: the backend this platform runs in bfloat16, against XLA's on the same inputs
  impl = attention.resolve(cfg.model.attention_impl, platform, jnp.bfloat16)
  tokens = (cfg.model.image_size // cfg.model.patch_size) ** 2
  heads = cfg.model.num_heads
  shape = (2, tokens, heads, cfg.model.hidden_size // heads)
  q, k, v = (
    jnp.asarray(np.random.default_rng(i).standard_normal(shape), jnp.bfloat16) for i in range(3)
  )
  with jax.set_mesh(shd.make_mesh()):
    got = jax.jit(lambda q, k, v: attention.attend(q, k, v, impl=impl))(q, k, v)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref = jax.jit(lambda q, k, v: attention.attend(q, k, v, impl="xla"))(*f32)
  err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref)))
  return {
    "loss_f32": l32,
    "loss_bf16": l16,
    "bf16_vs_f32_loss_rel": abs(l16 - l32) / abs(l32),
    "bf16_vs_f32_grad_cos": cos,
    "attention_impl": impl,
    "attention_shape": list(shape),
    "attention_max_abs_err": err,
  }


def sampling_and_reconstruct(cfg, folder: str, num_samples: int) -> tuple[dict, dict]:
  """A Reconstructor of the config's model (random weights) on UEF2017's frames: images/s and
  frames/s after compilation."""
  from flax import nnx

  from cdeit_jax import config_lib
  from cdeit_jax.checkpoints import checkpoint, loading
  from cdeit_jax.data import npz_files, stats
  from cdeit_jax.infer.reconstructor import Reconstructor
  from cdeit_jax.model.network import CDEIT

  model = CDEIT(**config_lib.model_kwargs(cfg, loading.resolve(cfg)), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  state = _perturbed(state)
  mean, std = stats.authors_stats()
  wd = os.path.join(folder, "model")
  if not os.path.isdir(os.path.join(wd, "checkpoints")):
    checkpoint.save_inference(wd, nnx.merge(graphdef, state), cfg, mean=mean, std=std, step=0)
  uef = os.path.join(REPO, "data", "uef2017")
  ys = np.stack([np.load(os.path.join(uef, n))["ys"].ravel() for n in npz_files.list_files(uef)])
  frames = ys[np.arange(64) % len(ys)]
  t0 = time.perf_counter()
  rec = Reconstructor.from_workdir(
    wd, units="uef2017", overrides={"sampling.num_samples": num_samples}
  )
  rec.reconstruct(frames)  # compiles every bucket it needs
  ready_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  r = rec.reconstruct(frames)
  seconds = time.perf_counter() - t0
  assert np.isfinite(r.images).all(), "non-finite images"
  frames_per_s = len(frames) / seconds
  return (
    {
      "images_per_s": frames_per_s * rec.num_samples,
      "num_samples": rec.num_samples,
      "steps": rec.steps,
      "dtype": rec.config.model.dtype,
    },
    {"frames_per_s": frames_per_s, "frames": len(frames), "ready_s": ready_s},
  )


def _train_py(workdir: str, *extra: str) -> subprocess.Popen:
  # this process holds most of an accelerator's memory (JAX preallocates 75 % of it): the small
  # runs allocate what they use from the rest
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  return subprocess.Popen(
    [sys.executable, "train.py", "--config", CONFIGS["cpu"], "--workdir", workdir, *RESUME, *extra],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _records(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  return [json.loads(line) for line in open(path).read().splitlines() if line.endswith("}")]


def _logged_step(workdir: str) -> int:
  return max((r["step"] for r in _records(workdir)), default=0)


def _ema(workdir: str, step: int) -> list[np.ndarray]:
  from flax import nnx

  from cdeit_jax.checkpoints import loading, reader

  with reader.open_run(workdir, step) as run:
    meta, skipped = run.first_readable()
    system = loading.resolve(meta.config, meta.record)
    model = run.load(system, weights="ema", passed=skipped).model
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def resume(folder: str) -> dict:
  """train.py straight, and killed by SIGTERM after step KILL_AFTER then resumed: equal?"""
  straight, killed = os.path.join(folder, "straight"), os.path.join(folder, "killed")
  for wd in (straight, killed):
    if os.path.exists(wd):
      raise RuntimeError(f"{wd}: exists; give a new --out")
  p = _train_py(straight)
  err = p.communicate()[1]
  if p.returncode:
    raise RuntimeError(f"train.py (straight) exited {p.returncode}: {err[-2000:]}")
  p = _train_py(killed)
  deadline = time.time() + 600
  while time.time() < deadline and p.poll() is None and _logged_step(killed) < KILL_AFTER:
    time.sleep(0.2)
  p.send_signal(signal.SIGTERM)
  stopped_rc = p.wait(timeout=600)
  stopped_at = _logged_step(killed)
  p = _train_py(killed)
  err = p.communicate()[1]
  if p.returncode:
    raise RuntimeError(f"train.py (resumed) exited {p.returncode}: {err[-2000:]}")
  last = int(RESUME[0].split("=")[1])
  # every validation loss, and the training loss of every logged step but the one after the stop
  # (a log line averages the steps since the last line, and the stop wrote one)
  val = [
    [(r["step"], r["val_loss"]) for r in _records(w) if "val_loss" in r] for w in (straight, killed)
  ]
  loss = [{r["step"]: r["loss"] for r in _records(w) if "loss" in r} for w in (straight, killed)]
  after = min((s for s in loss[0] if s > stopped_at), default=None)
  same_losses = all(loss[1].get(s) == v for s, v in loss[0].items() if s != after)
  weights = all(np.array_equal(x, y) for x, y in zip(_ema(straight, last), _ema(killed, last)))
  return {
    "exact": bool(weights and val[0] == val[1] and same_losses and stopped_at < last),
    "ema_weights_equal": weights,
    "val_losses_equal": val[0] == val[1] and len(val[0]) > 0,
    "train_losses_equal": same_losses,
    "steps": last,
    "stopped_at_step": stopped_at,
    "sigterm_exit_code": stopped_rc,
  }


def _run(name: str, fn, result: dict, *args):
  t0 = time.perf_counter()
  try:
    got = fn(*args)
  except Exception as e:  # kept as this section's error; the other sections still run
    result[name] = {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()}
    print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
    return None
  if isinstance(got, dict):
    got["seconds"] = round(time.perf_counter() - t0, 1)
  result[name] = got
  return got


def verdict(result: dict) -> list[str]:
  """The bars this result misses (empty: passed)."""
  missed = [f"{k}: {v['error']}" for k, v in result.items() if isinstance(v, dict) and "error" in v]
  n = result.get("numerics", {})
  if "loss_f32" in n:
    if not n["bf16_vs_f32_loss_rel"] <= BARS["loss_rel"]:
      missed.append(f"bf16_vs_f32_loss_rel {n['bf16_vs_f32_loss_rel']:.4f} > {BARS['loss_rel']}")
    if not n["bf16_vs_f32_grad_cos"] >= BARS["grad_cos"]:
      missed.append(f"bf16_vs_f32_grad_cos {n['bf16_vs_f32_grad_cos']:.4f} < {BARS['grad_cos']}")
    if not n["attention_max_abs_err"] <= BARS["attention"]:
      missed.append(f"attention_max_abs_err {n['attention_max_abs_err']:.4f} > 0.02")
  r = result.get("resume", {})
  if "exact" in r and not r["exact"]:
    missed.append(f"resume not exact: {r}")
  return missed


def table(result: dict) -> str:
  """One line a section: its figures, or its error (a section that did not run: skipped)."""
  nan = float("nan")

  def train(t):
    frac = t.get("fraction_of_peak") or t.get("fraction_of_matmul_rate")
    return (
      f"{t['samples_per_s']} samples/s, {t['tflops_per_device']:.4g} TFLOP/s per device, {frac} "
      f"of {'peak' if t.get('fraction_of_peak') else 'matmul rate'}; {t['dtype']}, attention "
      f"{t['attention_impl']}, batch {t['global_batch']}, compile {t['compile_s']} s"
    )

  lines = {
    "train": train,
    "numerics": lambda n: (
      f"loss rel {n['bf16_vs_f32_loss_rel']:.2e}, grad cos {n['bf16_vs_f32_grad_cos']:.5f}, "
      f"attention ({n['attention_impl']}) max err {n['attention_max_abs_err']:.2e}"
    ),
    "sampling": lambda x: f"{x.get('images_per_s', nan):.1f} images/s",
    "reconstruct": lambda x: f"{x.get('frames_per_s', nan):.1f} frames/s",
    "resume": lambda x: f"exact {x['exact']} (SIGTERM at step {x['stopped_at_step']})",
  }
  where = f"{result['platform']} ({result['device_kind']}, {result['devices']} devices)"
  rows = [("platform", where)]
  for name, line in lines.items():
    got = result.get(name)
    if not got or "skipped" in got:
      text = f"skipped ({got['skipped']})" if got else "skipped"
    else:
      text = got["error"][:200] if "error" in got else line(got)
    rows.append((name, text))
  return "\n".join(f"{k:<12} {v}" for k, v in rows)


def write(result: dict, path: str) -> None:
  """The result so far, whole or not at all (every section's end)."""
  from cdeit_jax.common import fileio

  fileio.write_text(path, json.dumps(result, indent=1, default=str))


def refuse(message: str) -> None:
  """A bad argument, in one line (no usage text), exit code 2, before any work."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def main() -> None:
  from cdeit_jax import cli

  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="output folder (accelerator_check.json)")
  p.add_argument(
    "--config", default=None, help="the train and sampling config (default: by platform)"
  )
  p.add_argument("--per-device-batch", type=int, default=None, help="default: 2 (CPU), 8")
  p.add_argument("--steps", type=int, default=5, help="timed train steps")
  p.add_argument("--num-samples", type=int, default=8, help="samples a frame (reconstruct)")
  p.add_argument(
    "--skip", default="", help=f"sections to leave out, of {','.join(SECTIONS)} (and reconstruct)"
  )
  p.add_argument("--budget-s", type=float, default=None, help="start no section after this")
  a = cli.parse_args(p)
  check(
    a.out, config=a.config, per_device_batch=a.per_device_batch, steps=a.steps,
    num_samples=a.num_samples, skip=a.skip, budget_s=a.budget_s,
  )  # fmt: skip


def check(
  out: str,
  *,
  config: str | None,
  per_device_batch: int | None,
  steps: int,
  num_samples: int,
  skip: str,
  budget_s: float | None,
) -> None:
  """Every section (module docstring) into `out`/accelerator_check.json, the table printed;
  exits 1 when a section failed or a bar was missed, 0 when not, 2 on a bad argument."""
  # `reconstruct` is the sampling section's second half (one Reconstructor serves both)
  left_out = {"sampling" if s == "reconstruct" else s for s in filter(None, skip.split(","))}
  if left_out - set(SECTIONS):
    refuse(f"--skip {skip}: {', '.join(sorted(left_out - set(SECTIONS)))} is not one of {SECTIONS}")
  from cdeit_jax.checkpoints import shipped
  from cdeit_jax.common import fileio
  from cdeit_jax.common.errors import InputError

  try:
    fileio.output_folder(out, "--out")  # the folder accelerator_check.json goes into
    shipped.refuse_write(out, "--out")
  except InputError as e:
    refuse(str(e))
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, "accelerator_check.json")
  t0 = time.perf_counter()
  result = platform_info()
  plat = result["platform"]
  cfg = load_config(config, plat)
  result["config"] = config or CONFIGS.get(plat, CONFIGS["cpu"])
  batch = per_device_batch or (2 if plat == "cpu" else 8)
  runs = {
    "train": (train, cfg, batch, steps),
    "numerics": (numerics, cfg, plat),
    "sampling": (sampling_and_reconstruct, cfg, out, num_samples),
    "resume": (resume, os.path.join(out, "resume")),
  }
  for name in SECTIONS:
    spent = time.perf_counter() - t0
    if name in left_out:
      result[name] = {"skipped": "--skip"}
    elif budget_s is not None and spent >= budget_s:
      result[name] = {"skipped": f"--budget-s {budget_s:g}: {spent:.0f} s spent before it"}
    else:
      fn, *args = runs[name]
      got = _run(name, fn, result, *args)
      if name == "sampling" and got is not None:
        result["sampling"], result["reconstruct"] = got
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write(result, path)
  missed = verdict(result)
  # passed: no section failed and no bar was missed, of the sections that ran (`skipped`)
  result["passed"], result["missed"] = not missed, missed
  result["skipped"] = [k for k in SECTIONS if "skipped" in result.get(k, {})]
  write(result, path)
  print(table(result))
  print(
    f"{'passed' if not missed else 'MISSED: ' + '; '.join(missed)} ({result['seconds']} s): {path}"
  )
  sys.exit(1 if missed else 0)


if __name__ == "__main__":
  main()
