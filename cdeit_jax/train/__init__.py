"""Training: state and step, the loop, goodput, the workdir lock, ahead-of-time compile checks."""
