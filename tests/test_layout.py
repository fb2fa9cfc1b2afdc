"""The package's layout (issue 21): stages as folders, no import circles, no module over 700 lines, no private name
imported across modules, no module global changed from another module; verl's config read by dotted key only at the
edges (issue 43). Each check also runs on a planted fault, so a check that finds nothing is known to be able to find
something."""

import ast
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "grpo_lab"
MAX_LINES = 700
MAX_TOP_MODULES = 12


def modules(pkg_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package under pkg_dir."""
    out = {}
    for f in sorted(pkg_dir.rglob("*.py")):
        parts = list(f.relative_to(pkg_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The package module a dotted import name lands in (`a.b.func` -> `a.b`)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> dict[str, dict[str, set[str]]]:
    """module -> {imported package module -> names taken from it}, module-level and function-level imports alike."""
    root = next(iter(mods)).split(".")[0]
    graph: dict[str, dict[str, set[str]]] = {}
    for name, f in mods.items():
        edges: dict[str, set[str]] = {}
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == root and (t := _resolve(a.name, mods)):
                        edges.setdefault(t, set())
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != root:
                    continue
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in mods:  # `from pkg import module`
                        edges.setdefault(sub, set())
                    elif t := _resolve(node.module, mods):
                        edges.setdefault(t, set()).add(a.name)
        edges.pop(name, None)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as a sorted list of names.

    A package's __init__ imported by its own modules is not a circle: Python runs it first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def edges(v):
        return [w for w in graph.get(v, {}) if w in graph and not v.startswith(w + ".")]

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(graph) -> list[str]:
    return sorted(f"{m} imports {t}.{n}" for m, es in graph.items() for t, ns in es.items() for n in ns
                  if n.startswith("_") and not n.startswith("__"))


def _aliases(tree: ast.AST, mods: dict[str, Path]) -> dict[str, str]:
    """Local names bound to a package module (`from grpo_lab.x import y as z`, `import grpo_lab.x as z`)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    out[a.asname] = a.name
    return out


# the stages a job passes, in order; memory/, tasks/, verl_schema/ and the top-level modules are libraries (no stage)
STAGES = {"cli": 1, "checks": 2, "launch": 3, "after_run": 4}


def stage(name: str) -> int | None:
    parts = name.split(".")
    return STAGES.get(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else None


def imports_of_later_stages(graph) -> list[str]:
    """`a imports b` where b's stage comes after a's: an arrow running back up the pipeline."""
    return sorted(f"{m} imports {t}" for m, es in graph.items() for t in es
                  if stage(m) and stage(t) and stage(t) > stage(m))


MUTATORS = {"append", "extend", "insert", "update", "add", "pop", "clear", "remove", "setdefault", "discard"}


def rebound_globals(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> its globals that its own functions rebind (`global X`): state that changes while the program runs."""
    out: dict[str, set[str]] = {}
    for name, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Global):
                out.setdefault(name, set()).update(node.names)
    return out


def foreign_globals(mods: dict[str, Path], users: dict[str, Path] | None = None) -> list[str]:
    """Assignments to another module's globals (`mod.X = ...`, `mod.X += ...`), private reads (`mod._x`), in-place
    changes of another module's containers (`mod.LIST.append(...)`) and reads of a global that its module rebinds at
    run time (`global X` there, `mod.X` here): in the package's modules and in its users (run.py, the plugins)."""
    found = []
    rebound = rebound_globals(mods)
    for name, f in {**mods, **(users or {})}.items():
        tree = ast.parse(f.read_text())
        alias = _aliases(tree, mods)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in alias:
                    found.append(f"{name}:{node.lineno} sets {alias[t.value.id]}.{t.attr}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias:
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    found.append(f"{name}:{node.lineno} reads {alias[node.value.id]}.{node.attr}")
                elif node.attr in rebound.get(alias[node.value.id], ()) and alias[node.value.id] != name:
                    found.append(f"{name}:{node.lineno} reads {alias[node.value.id]}.{node.attr}, rebound at run time")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and isinstance(node.func.value, ast.Attribute) and isinstance(node.func.value.value, ast.Name)
                    and node.func.value.value.id in alias and node.func.value.attr.isupper()):
                found.append(f"{name}:{node.lineno} changes {alias[node.func.value.value.id]}.{node.func.value.attr}")
    return sorted(set(found))


# verl's config read by dotted key (issue 43): grpo_lab.verl_keys' get or lookup, under whatever name it is imported,
# on a mapping that is verl's config, and a typed view's .at(key); everything else reads the view's fields
# (grpo_lab/memory/verl_view.py). The first argument's text says what is read: these are plan.json, conf/ files,
# provenance layers and verl's own defaults, not the job's config.
NOT_VERL_CONFIG = {"plan", "run.plan", "self.plan", "self.hydra", "data", "verl_tree()", "doc", "m", "defaults",
                   "theirs", "schema().defaults"}
MAX_DOTTED_READS, MAX_DOTTED_MODULES = 30, 4


def dotted_reads(mods: dict[str, Path]) -> list[str]:
    """module:line of each read of verl's config by dotted key."""
    out = []
    for name, f in mods.items():
        tree = ast.parse(f.read_text())
        readers = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").endswith(".verl_keys") for a in n.names if a.name in ("get", "lookup")}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and n.args and (
                    isinstance(n.func, ast.Name) and n.func.id in readers
                    and ast.unparse(n.args[0]) not in NOT_VERL_CONFIG
                    or isinstance(n.func, ast.Attribute) and n.func.attr == "at"):
                out.append(f"{name}:{n.lineno}")
    return sorted(out)


# ------------------------------------------------------------------------------------------------ the package itself

MODS = modules(PKG)
GRAPH = imports(MODS)
USERS = {"run": ROOT / "run.py", **{f"hydra_plugins.{f.parent.name}.{f.stem}": f
                                     for f in sorted((ROOT / "hydra_plugins").rglob("*.py"))}}


def test_no_import_circles():
    assert circles(GRAPH) == [], "import circles inside grpo_lab (module-level or function-level imports)"


def test_no_stage_imports_a_later_stage():
    assert imports_of_later_stages(GRAPH) == []


def test_no_module_over_700_lines():
    long = {n: len(f.read_text().splitlines()) for n, f in MODS.items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}


def test_no_private_name_imported_across_modules():
    assert private_imports(GRAPH) == []


def test_no_module_global_changed_from_another_module():
    assert foreign_globals(MODS, USERS) == []


def test_the_top_level_holds_stage_folders_and_few_modules():
    top = [f.name for f in PKG.glob("*.py") if f.name != "__init__.py"]
    assert len(top) <= MAX_TOP_MODULES, top
    folders = sorted(d.name for d in PKG.iterdir() if d.is_dir() and (d / "__init__.py").exists())
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)]
    for d in folders:
        doc = ast.get_docstring(ast.parse((PKG / d / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"grpo_lab/{d}/__init__.py says what the stage does"
        assert re.search(rf"^\s+{d}/ ", layout, re.M), f"README's Layout section names grpo_lab/{d}/"


def test_verls_config_is_read_by_dotted_key_only_at_the_edges():
    reads = dotted_reads(MODS)
    assert len(reads) <= MAX_DOTTED_READS and len({r.split(":")[0] for r in reads}) <= MAX_DOTTED_MODULES, reads


def test_every_package_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {n for n, f in MODS.items() if f.name == "__init__.py"}
    assert packages <= listed, sorted(packages - listed)


# ------------------------------------------------------------------------------------------------ planted faults


def plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        p = tmp_path / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return modules(tmp_path / "pkg")


def test_a_planted_circle_is_found_even_through_a_function_level_import(tmp_path):
    mods = plant(tmp_path, {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/one.py": "from pkg.b import two\n",
        "b/__init__.py": "",
        "b/two.py": "def f():\n    from pkg.c import three\n",
        "c.py": "import pkg.a.one\n",
        "d.py": "from pkg import c\n",
    })
    assert circles(imports(mods)) == [["pkg.a.one", "pkg.b.two", "pkg.c"]]


def test_a_package_init_imported_by_its_own_modules_is_no_circle(tmp_path):
    mods = plant(tmp_path, {"__init__.py": "from pkg.x import y\n", "x.py": "import pkg\ny = 1\n"})
    assert circles(imports(mods)) == []


def test_planted_private_imports_and_foreign_globals_are_found(tmp_path):
    mods = plant(tmp_path, {
        "__init__.py": "",
        "a.py": "LAST = None\nREFUSED = []\n_secret = 1\n",
        "b.py": ("from pkg import a\nfrom pkg.a import _secret\n\n"
                 "def f():\n    a.LAST = 2\n    a.REFUSED.append(3)\n    return a._secret\n"),
        "c.py": "CURRENT = None\n\ndef parse(x):\n    global CURRENT\n    CURRENT = x\n",
        "d.py": "from pkg import c\n\ndef g():\n    return c.CURRENT\n",
    })
    assert private_imports(imports(mods)) == ["pkg.b imports pkg.a._secret"]
    assert foreign_globals(mods) == ["pkg.b:5 sets pkg.a.LAST", "pkg.b:6 changes pkg.a.REFUSED",
                                     "pkg.b:7 reads pkg.a._secret", "pkg.d:4 reads pkg.c.CURRENT, rebound at run time"]
    user = tmp_path / "run.py"
    user.write_text("from pkg import a\na.LAST = 1\n")
    assert foreign_globals(mods, {"run": user})[-1] == "run:2 sets pkg.a.LAST"


def test_a_planted_import_of_a_later_stage_is_found(tmp_path):
    mods = plant(tmp_path, {
        "__init__.py": "", "facts.py": "",
        "cli/__init__.py": "", "cli/one.py": "def f():\n    from pkg.launch import two\n",
        "checks/__init__.py": "from pkg import facts\nfrom pkg.cli import one\n",
        "launch/__init__.py": "", "launch/two.py": "from pkg.checks import x\n",
        "checks/x.py": "from pkg.memory import m\n",
        "memory/__init__.py": "", "memory/m.py": "from pkg.launch import two\n",
    })
    assert imports_of_later_stages(imports(mods)) == ["pkg.cli.one imports pkg.launch.two"]


def test_planted_dotted_reads_of_verls_config_are_found(tmp_path):
    mods = plant(tmp_path, {
        "__init__.py": "", "verl_keys.py": "def get(d, key):\n    return d\n",
        "a.py": ("from pkg.verl_keys import get as read\n\n"
                 "def f(verl, plan, cfg):\n    return read(verl, 'trainer.nnodes'), read(plan, 'memory.x')\n\n"
                 "def g(cfg):\n    return cfg.at('data.train_files')\n"),
    })
    assert dotted_reads(mods) == ["pkg.a:4", "pkg.a:7"]


@pytest.mark.parametrize("module", sorted(MODS))
def test_every_module_says_what_it_is_for(module):
    assert ast.get_docstring(ast.parse(MODS[module].read_text())), f"{module} has a docstring"
