"""`python -m cdeit_jax`: the package's commands, each with its first line (the commands are
`python -m cdeit_jax.NAME`, and train.py and eval.py at the repository's root; the commands once
under `cdeit_jax.tools` are these)."""

import ast
import pathlib
import re
import sys


def commands() -> list[tuple[str, str]]:
  """(NAME, its docstring's first sentence) of each top-level module that runs as a command, read
  from the source (nothing is imported: JAX does not start)."""
  out = []
  for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
    tree = ast.parse(path.read_text())
    is_command = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    if is_command and path.stem != "__main__":
      first = " ".join((ast.get_docstring(tree) or "").strip().split("\n\n")[0].split())
      if first.startswith(f"`python -m cdeit_jax.{path.stem}`: "):  # the name, then what it does
        first = first.split(": ", 1)[1]
      first = re.split(r"(?<=[a-z)])\. |: |; ", first)[0]
      out.append((path.stem, first.rstrip(".")))
  return out


def main() -> None:
  """Print the commands and how to run them."""
  rows = commands()
  width = max(len(name) for name, _ in rows)
  print("cdeit-jax's commands: python -m cdeit_jax.NAME --help (and train.py, eval.py at the root)")
  for name, line in rows:
    print(f"  {name:<{width}}  {line}")
  sys.exit(2)


if __name__ == "__main__":
  main()
