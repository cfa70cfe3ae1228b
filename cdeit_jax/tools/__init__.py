"""The package's secondary commands, in the top layer beside the main ones (`python -m
cdeit_jax.tools.NAME`): `interpolate` (WiSE-FT), `voltage_stats` (normalisation statistics),
`answer_study` (KTC2023's answer rules), `phantom_stats` and `frame_drift` (what the
simulator's distributions have to span), `accelerator_check` (the figures that prove an
accelerator, `make accelerator-check`). Each is a thin command over the library module that
does the work; nothing imports them."""
