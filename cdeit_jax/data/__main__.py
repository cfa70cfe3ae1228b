"""`python -m cdeit_jax.data ...`: the command of the flat layout's data module, which is a
package now; one line names the command that replaced it."""

import sys

print(
  "error: cdeit_jax.data is a package of modules now; the statistics command is "
  "`python -m cdeit_jax.tools.voltage_stats` (docs/data.md)",
  file=sys.stderr,
)
sys.exit(2)
