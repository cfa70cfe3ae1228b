"""The package's shape: layers that import one way, no import circles, small modules and
functions, configs readable without the physics."""

import ast
import dataclasses
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


def _is_main_block(node: ast.AST) -> bool:
  """`if __name__ == "__main__":`, a module's command: the top layer, which nothing imports."""
  t = getattr(node, "test", None)
  return (
    isinstance(node, ast.If)
    and isinstance(t, ast.Compare)
    and isinstance(t.left, ast.Name)
    and t.left.id == "__name__"
  )


def _is_command(path: pathlib.Path) -> bool:
  """A module that runs as a command: it has an `if __name__ == "__main__":` block."""
  return any(_is_main_block(n) for n in ast.parse(path.read_text()).body)


def import_graph() -> dict[str, set[str]]:
  """Module -> the package modules it imports anywhere in its text (function-level imports
  included: a circle through them is a circle all the same), its command block aside."""
  graph = {}
  for path in PACKAGE.rglob("*.py"):
    deps = set()
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not _is_main_block(n)]
    for node in ast.walk(tree):
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


# The layers, lowest first: a module imports only from its own layer or lower ones. The top
# layer is the package's own modules (the public API, the config tree, the commands).
LAYERS = ("common", "eit", "model", "config_lib", "data", "checkpoints", "infer", "train", "")


def layer(module: str) -> int:
  parts = module.split(".")
  head = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""
  return LAYERS.index(head)


def test_commands_live_in_the_top_layer():
  """No `if __name__ == "__main__":` block below the top layer: a library module is imported,
  never run; its command, if it had one, is a thin module at the package's top level."""
  below = sorted(
    str(path.relative_to(PACKAGE))
    for path in PACKAGE.rglob("*.py")
    if layer(_module(path)) < len(LAYERS) - 1
    and any(_is_main_block(n) for n in ast.parse(path.read_text()).body)
  )
  assert below == []
  assert layer("cdeit_jax.interpolate") == layer("cdeit_jax.reconstruct") == len(LAYERS) - 1


ROOT = PACKAGE.parent
# The two documented entry points at the repository's root; every other command is a top-level
# module of the package (`python -m cdeit_jax.NAME`).
ROOT_COMMANDS = ("train.py", "eval.py")
# Mains over MAIN_LINES and imports of a command module, allowed by name.
LONG_MAINS = ()  # none: every command's main reads its flags and calls one function
COMMAND_IMPORTS = ()  # none: a command imports the library, never another command
MAIN_LINES = 30
PLUMBING = ("cdeit_jax", "cdeit_jax.cli", "cdeit_jax.config_lib")  # shared by the commands


def command_files() -> list[str]:
  """Every module that runs as a command (an `if __name__ == "__main__":` block), relative to the
  repository's root: the benchmarks (bench/) and the tests aside."""
  skip = ("bench", "tests", "data", "models", "runs")
  tops = [d for d in ROOT.iterdir() if d.is_dir() and d.name not in skip and d.name[0] != "."]
  paths = [*ROOT.glob("*.py"), *(p for d in tops for p in d.rglob("*.py"))]
  return sorted(str(p.relative_to(ROOT)) for p in paths if _is_command(p))


def _is_home(rel: str) -> bool:
  parts = pathlib.PurePosixPath(rel).parts
  return rel in ROOT_COMMANDS or (len(parts) == 2 and parts[0] == "cdeit_jax")


def long_mains(rels: list[str], root: pathlib.Path = ROOT) -> list[str]:
  """`path:name lines` of each command's `main`, and of a `_main` it calls, over MAIN_LINES."""
  long = []
  for rel in rels:
    fns = {
      n.name: n
      for n in ast.parse((root / rel).read_text()).body
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    if "main" not in fns:
      continue
    calls = {getattr(c.func, "id", None) for c in ast.walk(fns["main"]) if isinstance(c, ast.Call)}
    names = ["main", *(["_main"] if "_main" in fns and "_main" in calls else [])]
    for name in names:
      n = fns[name].end_lineno - fns[name].lineno + 1
      if n > MAIN_LINES:
        long.append(f"{rel}:{name} {n}")
  return long


def command_imports(rels: list[str], root: pathlib.Path = ROOT) -> list[str]:
  """`path -> module` of each command module importing another command module (anywhere in its
  text, its command block included), the shared plumbing aside."""
  modules = {r[:-3].replace("/", "."): r for r in rels if r.startswith("cdeit_jax/")}
  found = []
  for rel in rels:
    for node in ast.walk(ast.parse((root / rel).read_text())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cdeit_jax"):
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
      for name in names:
        if name in modules and name not in PLUMBING and modules[name] != rel:
          found.append(f"{rel} -> {name}")
  return sorted(set(found))


def test_commands_live_in_one_home():
  """Every command is `train.py`, `eval.py` or a top-level module of the package."""
  rels = command_files()
  assert "cdeit_jax/simulate.py" in rels and "train.py" in rels
  assert [r for r in rels if not _is_home(r)] == []
  assert not _is_home("cdeit_jax/tools/x.py") and not _is_home("recipes/x.py")


def test_command_mains_are_thin(tmp_path):
  """A command's `main` (and a `_main` it calls) reads its flags and calls one function with
  them: at most MAIN_LINES lines."""
  assert [m for m in long_mains(command_files()) if m.split(":")[0] not in LONG_MAINS] == []
  body = "".join(f"  x{i} = {i}\n" for i in range(MAIN_LINES))
  (tmp_path / "c.py").write_text(f"def main():\n  _main()\n\n\ndef _main():\n{body}")
  assert long_mains(["c.py"], tmp_path) == [f"c.py:_main {MAIN_LINES + 1}"]


def test_no_command_imports_another(tmp_path):
  """A command's library code is in a library module: no command module imports another (the
  package's `__init__`, `cli` and `config_lib` aside)."""
  assert set(command_imports(command_files())) <= set(COMMAND_IMPORTS)
  (tmp_path / "cdeit_jax").mkdir()
  (tmp_path / "cdeit_jax" / "a.py").write_text("from cdeit_jax import b, cli\n")
  (tmp_path / "cdeit_jax" / "b.py").write_text("import cdeit_jax.config_lib\n")
  got = command_imports(["cdeit_jax/a.py", "cdeit_jax/b.py"], tmp_path)
  assert got == ["cdeit_jax/a.py -> cdeit_jax.b"]


# Commands whose output flag another command or library module checks, the one it goes to.
OUTPUT_CHECKED_BY = {
  "cdeit_jax/interpolate.py": "cdeit_jax/checkpoints/interpolate.py",
  "cdeit_jax/reconstruct.py": "cdeit_jax/infer/reconstruct_frames.py",
  "cdeit_jax/ship.py": "cdeit_jax/infer/shipping.py",
  "cdeit_jax/export.py": "cdeit_jax/infer/shipping.py",
  # its --out is reconstruct's
  "bench/bench_reconstruct_memory.py": "cdeit_jax/infer/reconstruct_frames.py",
}


def _output_flags(path: pathlib.Path) -> list[str]:
  """The output flags a command defines: absl's `out` / `workdir` of a writer, argparse's
  `--out`."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      fn, name = ast.unparse(node.func), node.args[0].value
      if ("DEFINE" in fn and name == "out") or ("add_argument" in fn and name == "--out"):
        found.append(name)
  return found


def test_every_command_that_writes_refuses_a_shipped_model_folder():
  """The one rule of every writer (`checkpoints.shipped.refuse_write`: nothing is written into a
  model folder that ships with the code, at any depth): every command with an output flag, in
  the package, bench/ and recipes/, calls it, or hands its output to one that does."""
  root = PACKAGE.parent
  paths = [*PACKAGE.rglob("*.py"), *(root / "bench").glob("*.py"), *(root / "recipes").glob("*.py")]
  skipping = []
  for path in paths:
    if not _output_flags(path):
      continue
    rel = str(path.relative_to(root))
    checker = root / OUTPUT_CHECKED_BY.get(rel, rel)
    if "shipped.refuse_write(" not in checker.read_text():
      skipping.append(rel)
  assert skipping == []
  assert _output_flags(root / "cdeit_jax" / "voltage_stats.py") == ["out"]


def test_imports_run_one_way_between_layers():
  graph = import_graph()
  upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer(d) > layer(m))
  assert upward == []
  assert layer("cdeit_jax.common.errors") == 0 and layer("cdeit_jax.config_lib") == 3
  assert layer("cdeit_jax.simulate") == len(LAYERS) - 1


def test_the_package_is_small_at_the_top_and_in_each_function():
  """Directly in the package its commands and at most 5 other modules (the API, the config tree,
  the command plumbing), at least 4 subpackages, no function over 100 lines (the redesign's
  bars: a newcomer finds the commands at the top and the layers by the folders)."""
  top = sorted(p.name for p in PACKAGE.glob("*.py") if not _is_command(p))
  subpackages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
  assert len(top) <= 5, top
  assert len(subpackages) >= 4, subpackages
  long = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.end_lineno - node.lineno + 1 > 100:
          long.append(f"{path.relative_to(PACKAGE)}:{node.name}")
  assert long == []


def test_no_import_circle():
  graph = import_graph()
  assert "cdeit_jax.infer.evaluate" in graph and "cdeit_jax.train.aot" in graph
  assert circles(graph) == []


def test_configs_read_without_the_physics(tmp_path):
  """Loading every shipped config imports neither the simulator nor the conditioning (only the
  physics' plain descriptions: `eit.spec`, `eit.measurement`, `eit.layout` with its rules,
  device files and turns, which import no JAX); configs/device.py reads its calibrated device
  file."""
  from cdeit_jax.eit import device_files, layout

  device = tmp_path / "device.npz"
  lay = layout.from_rules(16, injection="skip-2", measure_injecting=True)
  device_files.save_device(
    str(device), dataclasses.replace(lay, gain=900.0, contact_impedance=1e-3)
  )
  code = (
    "import glob, sys; from cdeit_jax import config_lib\n"
    "for f in sorted(glob.glob('configs/*.py')):\n"
    f"  config_lib.load(f + (':{device}' if 'device' in f else ''))\n"
    "print(sorted(m for m in sys.modules if m.startswith('cdeit_jax.eit.') and m not in "
    "('cdeit_jax.eit.spec', 'cdeit_jax.eit.measurement', 'cdeit_jax.eit.layout', "
    "'cdeit_jax.eit.pattern_rules', 'cdeit_jax.eit.device_files', 'cdeit_jax.eit.turns')))"
  )
  r = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]"


def _compared_constants(node: ast.Compare) -> set:
  """The constants a comparison compares, inside tuples, lists and sets too."""
  found = set()
  for side in (node.left, *node.comparators):
    items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
    found |= {n.value for n in items if isinstance(n, ast.Constant)}
  return found


def test_one_forward_model_one_system_value_and_no_system_names_compared():
  """The measuring system is a value, not a name: no code compares a string to a preset's name
  ("cdeit16", "uef2017", "ktc2023") outside the preset table (eit/layout.py) and the config
  (config_lib.py), nor to a condition kind's name ("eim", "eim+linear", "linear") outside their
  registry (model/condition_kinds.py), in a plain or a tuple comparison; one forward model
  (`fem.CEM`, its system fixed or drawn per call: no
  second class that assembles and solves it); one measuring-system value (`layout.Layout`: no
  `Protocol` or `System` class beside it), and a drawn system is a typed value
  (`system.DrawnSystem`), not a dict."""
  from cdeit_jax.eit import layout
  from cdeit_jax.model import condition_kinds

  allowed = {name: ("eit/layout.py", "config_lib.py") for name in layout.PRESETS}
  allowed.update({name: ("model/condition_kinds.py",) for name in condition_kinds.KINDS})
  assert {"eim", "eim+linear", "linear"} <= set(allowed)
  found, classes = [], {}
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE).as_posix()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.Compare):
        names = _compared_constants(node) & set(allowed)
        if any(rel not in allowed[n] for n in names):
          found.append(f"{rel}:{node.lineno}")
      if isinstance(node, ast.ClassDef):
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        classes[f"{rel}:{node.name}"] = methods
  assert found == [], found
  forward = sorted(  # a class that assembles and solves the CEM (its private operators aside)
    c
    for c, methods in classes.items()
    if {"system_matrix", "electrode_potentials"} & methods and not c.split(":")[1].startswith("_")
  )
  assert forward == ["eit/fem.py:CEM"], forward
  assert [c for c in classes if c.split(":")[1] in ("Protocol", "System")] == []
  draw = next(
    n
    for n in ast.parse((PACKAGE / "eit" / "system.py").read_text()).body
    if isinstance(n, ast.FunctionDef) and n.name == "draw"
  )
  assert ast.unparse(draw.returns) == "DrawnSystem"


def test_one_table_of_named_systems():
  """Named measuring systems live in one table, `layout.PRESETS`, which holds each device's
  electrodes, patterns and units (no second table of data units): a data set named after a
  preset is read in that preset's units, "simulated" in the simulator's."""
  tables = []
  for path in sorted(PACKAGE.rglob("*.py")):
    for node in ast.parse(path.read_text()).body:
      targets = node.targets if isinstance(node, ast.Assign) else []
      if isinstance(node, ast.AnnAssign):
        targets = [node.target]
      for t in targets:
        if isinstance(t, ast.Name) and t.id.endswith("PRESETS"):
          tables.append(f"{path.relative_to(PACKAGE).as_posix()}:{t.id}")
  assert tables == ["eit/layout.py:PRESETS"], tables
  from cdeit_jax.eit import layout, measurement

  # the reference document's ratios (shared/README: UEF2017 1040.856 and 2; KTC2023 1978 and 2)
  ratios = measurement.resolve_ratios
  assert ratios("uef2017") == (1040.856, 2.0)
  assert ratios("ktc2023") == (1978.0, 2.0)
  assert ratios("simulated") == ratios("cdeit16") == (1.0, 1.0)
  assert layout.preset("uef2017").measures_as(layout.preset("cdeit16"))


def test_the_measuring_system_is_resolved_in_two_places():
  """A config's measuring system becomes a `Layout` in `config_lib.measuring_system`, called by
  the model's one resolution (`checkpoints/loading.py`'s `resolve`, whose value the commands
  hand down) and by the simulated distribution (`data/synthetic.py`'s `Generator`, built once
  per settings and cached): nowhere else does a layer resolve it again."""
  callers = set()
  for path in sorted(PACKAGE.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      f = getattr(node, "func", None)
      name = getattr(f, "attr", None) or getattr(f, "id", None)
      if isinstance(node, ast.Call) and name == "measuring_system":
        callers.add(path.relative_to(PACKAGE).as_posix())
  assert callers == {"checkpoints/loading.py", "data/synthetic.py"}, callers


def test_the_comparison_finder_sees_tuples():
  tree = ast.parse('(a, b) != ("eim+linear", "linear")')
  assert _compared_constants(tree.body[0].value) == {"eim+linear", "linear"}


def _is_commands_layer(rel: str) -> bool:
  return layer(_module(PACKAGE / rel)) == len(LAYERS) - 1


def test_one_model_system_made_in_one_place_and_handed_down():
  """What a model is of (`model.system.ModelSystem`) is made by `checkpoints.loading.resolve`
  alone, and no function below the commands takes a device, a layout or a system that defaults
  to None (to resolve it again itself): each requires the value its command resolved."""
  made, defaulted = [], []
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE).as_posix()
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
      if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(fn):
        f = getattr(node, "func", None)
        if isinstance(node, ast.Call) and (getattr(f, "id", None) or getattr(f, "attr", None)) == (
          "ModelSystem"
        ):
          made.append(f"{rel}:{fn.name}")
      if _is_commands_layer(rel):
        continue
      a = fn.args
      pairs = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults))
      pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
      for p, d in pairs:
        typed = "ModelSystem" in (ast.unparse(p.annotation) if p.annotation else "")
        named = p.arg in ("device", "layout", "lay", "kept") or typed
        if named and isinstance(d, ast.Constant) and d.value is None:
          defaulted.append(f"{rel}:{fn.name}({p.arg}=None)")
  assert made == ["checkpoints/loading.py:resolve"], made
  assert defaulted == [], defaulted


# Every command's output flag, by what it names: a file (checked before any work by
# `fileio.output_file`: a regular file or a new one, and an existing one only if the command
# wrote it, as `fileio.atomic_write` checks again when it publishes) or a folder.
FILE_OUTPUTS = {
  "cdeit_jax/export.py",  # a model file
  "cdeit_jax/calibrate.py",  # a device file
  "cdeit_jax/sequence.py",  # a moving sequence's npz
  "cdeit_jax/answer_study.py",  # the study's JSON
  "cdeit_jax/frame_misfit.py",  # the misfit's JSON
  "bench/bench_vs_reference.py",  # the benchmark's JSON
}
FOLDER_OUTPUTS = {
  "cdeit_jax/reconstruct.py",
  "cdeit_jax/simulate.py",
  "cdeit_jax/ship.py",
  "cdeit_jax/translate.py",
  "cdeit_jax/interpolate.py",
  "cdeit_jax/voltage_stats.py",
  "cdeit_jax/heldout_families.py",
  "cdeit_jax/accelerator_check.py",
  "bench/bench_reconstruct_memory.py",
  "cdeit_jax/gpu_run.py",
  "cdeit_jax/fingerprint.py",
  "cdeit_jax/uef2017_devices.py",
  "eval.py",
}
# Folder outputs checked by another module: the one that does it.
FOLDER_CHECKED_BY = {
  "eval.py": "cdeit_jax/infer/evaluate.py",
  "cdeit_jax/reconstruct.py": "cdeit_jax/infer/reconstruct_frames.py",
  "cdeit_jax/ship.py": "cdeit_jax/infer/shipping.py",
  "cdeit_jax/export.py": "cdeit_jax/infer/shipping.py",
  "bench/bench_reconstruct_memory.py": "cdeit_jax/infer/reconstruct_frames.py",
  "cdeit_jax/interpolate.py": "cdeit_jax/checkpoints/interpolate.py",
}
FOLDER_CHECKS = ("fileio.output_folder(", "fileio.writable_folder(", "outputs.check_out(")
# Modules that publish a whole folder by a rename (a model folder, a run's copy of its model, an
# interpolated checkpoint): never a file.
FOLDER_RENAMES = {
  "cdeit_jax/infer/shipping.py",
  "cdeit_jax/translate.py",
  "cdeit_jax/checkpoints/interpolate.py",
}


def test_writers_write_regular_files_only():
  """The writers, enumerated: every command with an output flag (in the package, bench/,
  recipes/ and the two scripts) says whether it names a file or a folder, and each file output
  is checked before any work by `fileio.output_file` (devices, FIFOs, sockets, folders and
  files the command did not write are refused), each folder output by a folder check (a file,
  a device or a FIFO there is one line); and no module publishes a file by a rename of
  its own: every file goes out through `fileio.atomic_write`, which refuses anything but a
  regular file or a missing path where it publishes (the one mechanism: a rename replaces
  whatever is at its path, /dev/full included)."""
  root = PACKAGE.parent
  paths = [*PACKAGE.rglob("*.py"), *(root / "bench").glob("*.py"), *(root / "recipes").glob("*.py")]
  paths += [root / "train.py", root / "eval.py"]
  commands = {str(p.relative_to(root)) for p in paths if _output_flags(p)}
  assert commands == FILE_OUTPUTS | FOLDER_OUTPUTS and not FILE_OUTPUTS & FOLDER_OUTPUTS, sorted(
    commands ^ (FILE_OUTPUTS | FOLDER_OUTPUTS)
  )
  text = lambda f: (root / FOLDER_CHECKED_BY.get(f, f)).read_text()
  unchecked = sorted(f for f in FILE_OUTPUTS if "fileio.output_file(" not in text(f))
  assert unchecked == []
  text = lambda f: (root / FOLDER_CHECKED_BY.get(f, f)).read_text()
  unchecked = sorted(f for f in FOLDER_OUTPUTS if not any(c in text(f) for c in FOLDER_CHECKS))
  assert unchecked == []  # a file, a device, a FIFO where a folder is meant: one line
  renames = set()
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      f = getattr(node, "func", None)
      if isinstance(node, ast.Call) and ast.unparse(f) in (
        "os.replace",
        "os.rename",
        "shutil.move",
      ):
        renames.add(str(path.relative_to(root)))
  assert renames - FOLDER_RENAMES == {"cdeit_jax/common/fileio.py"}, sorted(renames)


def _source(path: pathlib.Path) -> tuple[str, ast.Module]:
  text = path.read_text()
  return text, ast.parse(text)


def test_each_figure_of_merit_is_named_in_one_module():
  """The figures of merit are one registry (`infer.metrics`: IMAGE and GREIT): no other module
  of the package, nor eval.py or train.py, writes a figure's name out as a string of its own."""
  from cdeit_jax.infer import metrics

  names = set(metrics.FIGURES)
  root = PACKAGE.parent
  named = {}
  for path in [*PACKAGE.rglob("*.py"), root / "eval.py", root / "train.py"]:
    _, tree = _source(path)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and node.value in names:
        named.setdefault(str(path.relative_to(root)), set()).add(node.value)
  assert set(named) == {"cdeit_jax/infer/metrics.py"}, named
  assert named["cdeit_jax/infer/metrics.py"] == names


# Where a folder is told to be a translated run's: the run opened for inference (its frames
# resolved once, `run_opening.open_run`) and what a folder holds when a model is written or asked
# for (`checkpoint.refuse_import`, `checkpoint.missing_advice`). Nowhere else.
TELLS_TRANSLATED = {"infer/run_opening.py", "checkpoints/checkpoint.py"}


def test_no_branch_on_a_translation_below_the_commands():
  """What the frames are is one value (`infer.run_frames.Frames`, a translated run's
  `translated_run.TranslatedDevice`), which the Reconstructor, its guards, the evaluation and its
  sources call: no `if` (or conditional expression) below the commands tests a translation,
  outside the folders' identification (TELLS_TRANSLATED), and no class delegates through
  `__getattr__` (a module's lazy imports aside)."""
  branches, delegating = [], []
  for path in PACKAGE.rglob("*.py"):
    rel = str(path.relative_to(PACKAGE))
    text, tree = _source(path)
    if layer(_module(path)) == len(LAYERS) - 1 and "/" not in rel:
      continue  # a command
    for node in ast.walk(tree):
      if isinstance(node, (ast.If, ast.IfExp, ast.While)) and not _is_main_block(node):
        test = ast.get_source_segment(text, node.test) or ""
        if "translat" in test.lower() and rel not in TELLS_TRANSLATED:
          branches.append(f"{rel}:{node.lineno}: {test}")
      if isinstance(node, ast.ClassDef):
        for item in node.body:
          if isinstance(item, ast.FunctionDef) and item.name == "__getattr__":
            delegating.append(f"{rel}:{node.name}")
  assert branches == []
  assert delegating == []
  assert "is_translated" in (PACKAGE / "infer" / "run_opening.py").read_text()  # the one place


def test_the_evaluator_samples_through_the_reconstructor():
  """eval.py's evaluations (`infer.evaluate`, `infer.recording`, `infer.greit_test`,
  `infer.challenge`) sample through the Reconstructor's entry points: none imports the sampler
  module or calls a sampler's method, and none sizes its outputs by a model's channels."""
  calls = []
  for name in ("evaluate", "recording", "greit_test", "challenge"):
    path = PACKAGE / "infer" / f"{name}.py"
    text, tree = _source(path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        imported = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
        if any(n == "sampling" or n.endswith(".sampling") for n in imported):
          calls.append(f"{name}:{node.lineno}: imports the sampler")
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        chain = ast.unparse(node.func.value)
        if chain.endswith("sampler") or chain.endswith("sampler_fn"):
          calls.append(f"{name}:{node.lineno}: {ast.unparse(node.func)}")
      if isinstance(node, ast.Attribute) and node.attr in ("in_channels", "out_channels"):
        calls.append(f"{name}:{node.lineno}: sizes by .{node.attr}")
  assert calls == []
  assert "reconstruct_conditions(" in (PACKAGE / "infer" / "evaluate.py").read_text()


def test_python_m_cdeit_jax_lists_every_command():
  """`python -m cdeit_jax` names each command module of the package (the same set the structure
  check finds), with its docstring's first sentence, and exits 2 (no command given)."""
  import subprocess
  import sys

  listed = subprocess.run(
    [sys.executable, "-m", "cdeit_jax"], capture_output=True, text=True, cwd=ROOT, timeout=60
  )
  assert listed.returncode == 2, listed.stderr
  names = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
  tops = {r.split("/")[1][:-3] for r in command_files() if r.startswith("cdeit_jax/")}
  assert names == tops - {"__main__"} and "reconstruct" in names
  assert "Reconstruct a device's voltage frames into images" in listed.stdout
