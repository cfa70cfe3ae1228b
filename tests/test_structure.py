"""The package's shape: no import circles, configs readable without the physics."""

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).parent.parent / "cdeit_jax"


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
  p = PACKAGE.parent.joinpath(*name.split("."))
  return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
  """Module -> the package modules it imports anywhere in its text (function-level imports
  included: a circle through them is a circle all the same)."""
  graph = {}
  for path in PACKAGE.rglob("*.py"):
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        deps |= {a.name for a in node.names if a.name.startswith("cdeit_jax")}
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cdeit_jax"):
        for a in node.names:
          sub = f"{node.module}.{a.name}"
          deps.add(sub if _exists(sub) else node.module)
    graph[_module(path)] = {d for d in deps if _exists(d)} - {_module(path)}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_circle_finder_finds_a_circle():
  assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
  graph = import_graph()
  assert "cdeit_jax.evaluate" in graph and "cdeit_jax.aot" in graph
  assert circles(graph) == []


def test_configs_read_without_the_physics():
  """Loading every shipped config imports neither the simulator nor the conditioning."""
  code = ("import glob, sys; from cdeit_jax import config_lib\n"
          "for f in sorted(glob.glob('configs/*.py')): config_lib.load(f)\n"
          "print(sorted(m for m in sys.modules if m.startswith(('cdeit_jax.eit.', "
          "'cdeit_jax.conditioning')) and m != 'cdeit_jax.eit.spec'))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     cwd=PACKAGE.parent)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]"
