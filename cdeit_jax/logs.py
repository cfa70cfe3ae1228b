"""Training logs from process 0: console progress bar with ETA, `metrics.jsonl`, TensorBoard
event files (tensorboardX, no TensorFlow)."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any

log = logging.getLogger("cdeit_jax")


class MetricLogger:
  def __init__(self, workdir: str, total_steps: int, start_step: int, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    from tensorboardX import SummaryWriter
    from tqdm import tqdm
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
    self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                    mininterval=2.0)

  def write(self, step: int, metrics: dict[str, Any], advance: int = 0) -> None:
    if not self.enabled:
      return
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in metrics.items()}
    self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    for k, v in metrics.items():
      if isinstance(v, (int, float)) and v is not None and math.isfinite(v):
        self.tb.add_scalar(k, v, step)
    if advance:
      self.bar.update(advance)
    shown = {k: f"{v:.4g}" for k, v in metrics.items() if k in ("loss", "val_loss",
                                                                  "samples_per_sec")}
    self.bar.set_postfix(shown, refresh=False)

  def print(self, msg: str) -> None:
    if self.enabled:
      self.bar.write(msg, file=sys.stderr)

  def close(self) -> None:
    if self.enabled:
      self.bar.close()
      self.tb.close()
      self.jsonl.close()
