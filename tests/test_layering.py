"""The dependency rule of docs/design.md ("Layout"), made executable (issue 20).

    training/           torch, numpy, pyarrow and the standard library only; runs on a GPU box that has
                        none of datatrove, duckdb, lm-eval, tokenizers or transformers
    training/contract/  standard library, numpy and pyarrow only (nothing from training/ outside it);
                        the one exception is the S3 client, boto3, imported inside the functions of
                        training/contract/object_store.py and nowhere else in the project, so that
                        training/ imports (and trains on local datasets) without it
    pipelines/, tokenization/  import from training/ only training.contract
    tokenization/       stands below pipelines/ (the tokenize-and-shard step uses it), so it never
                        imports pipelines/ or validation/
    pipelines/ → validation/, one way only: the build validates its output (validation.validate),
                        the demo runs the audit, the decontamination index reads tasks through
                        validation's lm-eval helpers; validation/ never imports pipelines/
    pipelines/          lm-eval only inside functions: build workers import pipelines/ without it
    everything          no import circles among the project's own modules, and none among the
                        members of any folder (its modules, and its subfolders taken whole)
    training/           stands on at most 9 layers: its longest chain of imports among its members
                        (issue 48: it stood on 12, with a folder-level loop through seven members)

Two kinds of check:
- import checks, in a fresh interpreter whose `sys.meta_path` starts with a finder that raises
  ModuleNotFoundError for the forbidden top-level names (the interpreter first proves the block
  works: importing each blocked name must fail with the finder's own message);
- `ast` checks over every module of pipelines/, tokenization/, training/ and validation/.

Which imports the `ast` scan counts: every `import` / `from … import` anywhere in a file — at module
level, inside functions and methods, and under `if TYPE_CHECKING:` — plus `importlib.import_module`
and `__import__` calls with a literal module name. A function-local import is how an import circle
is usually hidden, not removed: the two modules still need each other, only the failure moves from
import time to the first call, so it still counts as an edge of the design's graph (and a
`TYPE_CHECKING` import still ties the two modules' designs together). Dynamic imports by a computed
name (the `gristmill` CLI's command table) are not seen. Each message names the place (file:line
and whether the import is at top level, in a function or under TYPE_CHECKING).

How a name resolves: `from . import x` / `from .. import x` resolve against the importing module's
package; `from pkg import x` is an edge to the submodule `pkg.x` when pkg/x.py (or pkg/x/) exists,
otherwise to `pkg` itself (x is a name defined there); `import a.b.c` is an edge to `a.b.c`. In the
module graph a name that is no module (a stale import of a moved module) counts as its longest
prefix that is one. Edges go to the named module only, not to the parent packages Python also
initialises (all our `__init__.py` are import-free; one that re-exports would show its own edges).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import pkgutil
import subprocess
import sys
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.xdist_group("layering"),  # the two import probes run once: every test on one worker
]

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("pipelines", "tokenization", "training", "validation")
DATA_STACK = ("datatrove", "duckdb", "lm_eval", "tokenizers", "transformers")
OBJECT_STORE_CLIENT = (
    "boto3",
    "botocore",
)  # imported only inside training/contract/object_store.py's functions
OBJECT_STORE_MODULE = "training.contract.object_store"
CONTRACT_THIRD_PARTY = {"numpy", "pyarrow"}
TRAINING_ENTRY_MODULES = ("training.train", "training.data.loader", "training.checkpoint.checkpointer")
BLOCK_MARK = "blocked by tests/test_layering.py"

# --------------------------------------------------------------------------------------------
# The ast scan


@dataclass(frozen=True)
class Import:
    src: str  # the importing module
    target: str  # the absolute dotted name imported (submodule when `from pkg import submodule`)
    path: str  # file, relative to the scanned root
    line: int
    where: str  # "top level" | "in a function" | "under TYPE_CHECKING"

    def __str__(self) -> str:
        return f"{self.src} -> {self.target}  ({self.path}:{self.line}, {self.where})"


def _module_files(root: Path, packages=PROJECT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the given top-level packages."""
    found: dict[str, Path] = {}
    for top in packages:
        base = root / top
        if not (base / "__init__.py").is_file():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            # only modules reachable as a package path (every directory on the way has __init__.py)
            dirs = [root.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts))]
            if all((d / "__init__.py").is_file() for d in dirs):
                found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    """Every import statement (and literal importlib.import_module/__import__ call) with its context."""

    def __init__(self, module: str, is_package: bool, known: set[str]):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.context: list[str] = []
        self.found: list[tuple[str, int, str]] = []  # (target, line, where)

    def _add(self, target: str, node: ast.AST) -> None:
        self.found.append((target, node.lineno, self.context[-1] if self.context else "top level"))

    def _in(self, where: str, nodes) -> None:
        self.context.append(where)
        for n in nodes:
            self.visit(n)
        self.context.pop()

    def visit_FunctionDef(self, node) -> None:
        for n in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if n is not None:
                self.visit(n)
        self._in("in a function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node) -> None:
        self._in("in a function", [node.body])

    def visit_If(self, node) -> None:
        if _is_type_checking(node.test):
            self._in("under TYPE_CHECKING", node.body)
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def visit_Import(self, node) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node) -> None:
        if node.level:
            parts = self.package.split(".") if self.package else []
            parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        targets = []  # one edge per module a statement names (`from m import a, b` is one edge to m)
        for alias in node.names:
            sub = f"{base}.{alias.name}" if base else alias.name
            target = sub if alias.name != "*" and sub in self.known else base
            if target not in targets:
                targets.append(target)
                self._add(target, node)

    def visit_Call(self, node) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if (
            name in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


def scan(root: Path = ROOT, packages=PROJECT) -> tuple[dict[str, Path], list[Import]]:
    """All project modules under `root` and every import they make (see the module docstring)."""
    modules = _module_files(root, packages)
    known = set(modules)
    imports: list[Import] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = _Collector(module, path.name == "__init__.py", known)
        collector.visit(tree)
        rel = path.relative_to(root).as_posix()
        imports += [Import(module, target, rel, line, where) for target, line, where in collector.found]
    return modules, imports


@functools.cache
def _project_scan() -> tuple[dict[str, Path], tuple[Import, ...]]:
    modules, imports = scan()
    return modules, tuple(imports)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _report(rule: str, bad: list[Import]) -> str:
    return f"{rule} ({len(bad)} offending imports):\n  " + "\n  ".join(sorted(str(b) for b in bad))


# --------------------------------------------------------------------------------------------
# Strongly connected components


def graph_of(modules, imports) -> dict[str, dict[str, list[Import]]]:
    """Module -> imported project module -> the imports making that edge (self-imports dropped)."""
    graph: dict[str, dict[str, list[Import]]] = {m: defaultdict(list) for m in modules}
    for imp in imports:
        if _top(imp.target) not in PROJECT:
            continue
        node = imp.target
        while node and node not in graph:  # a stale name: its longest prefix that is a module
            node = node.rpartition(".")[0]
        if node and node != imp.src:
            graph[imp.src][node].append(imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, list]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    sccs.append(sorted(component))
    return sccs


def shortest_cycle(graph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    return component


def describe_cycles(graph, sccs: list[list[str]], what: str = "modules") -> str:
    lines = []
    for component in sccs:
        lines.append(f"circle of {len(component)} {what}: " + " -> ".join(shortest_cycle(graph, component)))
        members = set(component)
        for src in component:
            for dst, imps in sorted(graph[src].items()):
                if dst in members:
                    lines += [f"    {imp}" for imp in imps]
    return "\n  " + "\n  ".join(lines)


# --------------------------------------------------------------------------------------------
# Import checks in a fresh interpreter with some top-level names made unimportable

_PROBE = r"""
import importlib, json, sys, traceback

root, blocked, modules, mark = sys.argv[1], set(json.loads(sys.argv[2])), json.loads(sys.argv[3]), sys.argv[4]


class Block:
    attempts = []

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            cls.attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} ({mark})", name=name)
        return None


preloaded = sorted(m for m in sys.modules if m.partition(".")[0] in blocked)
for m in preloaded:
    del sys.modules[m]
sys.meta_path.insert(0, Block)
sys.path.insert(0, root)

block_works = {}
for name in sorted(blocked):
    try:
        importlib.import_module(name)
        block_works[name] = "imported"
    except ImportError as e:
        block_works[name] = "blocked" if mark in str(e) else f"failed without the block: {e}"
Block.attempts.clear()

results = {}
for mod in modules:
    try:
        importlib.import_module(mod)
        results[mod] = None
    except BaseException:
        results[mod] = traceback.format_exc(limit=-8)
loaded_from = {m: getattr(sys.modules.get(m), "__file__", None) for m in modules if m in sys.modules}
leaked = sorted(m for m in sys.modules if m.partition(".")[0] in blocked)
print("LAYERING-PROBE " + json.dumps({
    "preloaded": preloaded, "block_works": block_works, "results": results,
    "attempts": sorted(set(Block.attempts)), "leaked": leaked, "loaded_from": loaded_from,
}))
"""


def _start_probe(blocked, modules) -> subprocess.Popen:
    args = [str(ROOT), json.dumps(sorted(blocked)), json.dumps(list(modules)), BLOCK_MARK]
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def _finish_probe(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=180)
    lines = [line for line in out.splitlines() if line.startswith("LAYERING-PROBE ")]
    assert proc.returncode == 0 and lines, f"the import probe itself failed (rc {proc.returncode}):\n{out}"
    return json.loads(lines[-1].removeprefix("LAYERING-PROBE "))


def contract_modules(root: Path = ROOT) -> list[str]:
    """Every module of the training.contract package, found by pkgutil (no import needed)."""

    def walk(path: Path, prefix: str) -> list[str]:
        found = []
        for info in pkgutil.iter_modules([str(path)]):
            found.append(prefix + info.name)
            if info.ispkg:
                found += walk(path / info.name, prefix + info.name + ".")
        return found

    return ["training.contract", *sorted(walk(root / "training" / "contract", "training.contract."))]


CONTRACT_MODULES = contract_modules()


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """Both import probes, run side by side (each pays for its own interpreter start)."""
    running = {
        "no data stack": _start_probe({*DATA_STACK, *OBJECT_STORE_CLIENT}, TRAINING_ENTRY_MODULES),
        "no torch": _start_probe({"torch", *DATA_STACK, *OBJECT_STORE_CLIENT}, CONTRACT_MODULES),
    }
    return {name: _finish_probe(proc) for name, proc in running.items()}


@pytest.mark.parametrize("probe", ["no data stack", "no torch"])
def test_the_block_really_blocks(probes, probe):
    result = probes[probe]
    assert not result["preloaded"], f"already imported at interpreter start: {result['preloaded']}"
    not_blocked = {k: v for k, v in result["block_works"].items() if v != "blocked"}
    assert not not_blocked, f"the meta_path block did not stop these imports: {not_blocked}"
    assert "datatrove" in result["block_works"] and "boto3" in result["block_works"]
    assert probe != "no torch" or "torch" in result["block_works"]


@pytest.mark.parametrize("module", TRAINING_ENTRY_MODULES)
def test_training_imports_without_the_data_stack(probes, module):
    """training/ must run on a GPU box without datatrove, duckdb, lm-eval, tokenizers, transformers
    (and without boto3, when it trains on local datasets)."""
    result = probes["no data stack"]
    loaded = result["loaded_from"].get(module) or ""
    assert result["results"][module] is None, (
        f"{module} does not import with {', '.join(DATA_STACK)} unimportable "
        f"(blocked imports attempted: {result['attempts']}):\n{result['results'][module]}"
    )
    assert Path(loaded).resolve().is_relative_to(ROOT), f"{module} came from {loaded}, not {ROOT}"
    assert not result["leaked"], f"blocked modules ended up in sys.modules: {result['leaked']}"


def test_contract_modules_were_found():
    assert len(CONTRACT_MODULES) > 1 and "training.contract.errors" in CONTRACT_MODULES, CONTRACT_MODULES


@pytest.mark.parametrize("module", CONTRACT_MODULES)
def test_contract_imports_without_torch(probes, module):
    """Every training.contract module imports with torch (and the data stack) unimportable."""
    result = probes["no torch"]
    assert result["results"][module] is None, (
        f"{module} does not import with torch, {', '.join(DATA_STACK)} unimportable "
        f"(blocked imports attempted: {result['attempts']}):\n{result['results'][module]}"
    )


# --------------------------------------------------------------------------------------------
# ast rules


def test_pipelines_and_tokenization_import_only_training_contract():
    _, imports = _project_scan()
    bad = [
        imp
        for imp in imports
        if _top(imp.src) in ("pipelines", "tokenization")
        and _within(imp.target, "training")
        and not _within(imp.target, "training.contract")
    ]
    assert not bad, _report(
        "pipelines/ and tokenization/ may import from training/ only training.contract", bad
    )


def test_contract_imports_only_stdlib_numpy_pyarrow():
    _, imports = _project_scan()
    allowed = set(sys.stdlib_module_names) | CONTRACT_THIRD_PARTY
    bad = [
        imp
        for imp in imports
        if _within(imp.src, "training.contract")
        and not _within(imp.target, "training.contract")
        and (_top(imp.target) in PROJECT or _top(imp.target) not in allowed)
        and not _object_store_client(imp)
    ]
    rule = "training/contract/ may import only the standard library, numpy, pyarrow and training.contract"
    assert not bad, _report(rule, bad)


def _object_store_client(imp: Import) -> bool:
    """boto3 (botocore) imported inside a function of training/contract/object_store.py: the S3 client."""
    return (
        imp.src == OBJECT_STORE_MODULE
        and _top(imp.target) in OBJECT_STORE_CLIENT
        and imp.where == "in a function"
    )


def test_only_object_store_imports_the_s3_client():
    """Every other module reaches S3 through training/contract/object_store.py (one client, its retries
    counted), and it imports boto3 only inside functions."""
    _, imports = _project_scan()
    bad = [
        imp for imp in imports if _top(imp.target) in OBJECT_STORE_CLIENT and not _object_store_client(imp)
    ]
    rule = "boto3/botocore are imported only inside functions of training/contract/object_store.py"
    assert not bad, _report(rule, bad)


def test_training_does_not_import_pipelines_validation_tokenization():
    _, imports = _project_scan()
    bad = [
        imp
        for imp in imports
        if _top(imp.src) == "training" and _top(imp.target) in ("pipelines", "validation", "tokenization")
    ]
    assert not bad, _report("training/ must not import pipelines/, validation/ or tokenization/", bad)


def test_tokenization_does_not_import_pipelines_or_validation():
    """pipelines/ (the tokenize-and-shard step) stands on tokenization/, never the other way round."""
    _, imports = _project_scan()
    bad = [
        imp
        for imp in imports
        if _top(imp.src) == "tokenization" and _top(imp.target) in ("pipelines", "validation")
    ]
    assert not bad, _report("tokenization/ must not import pipelines/ or validation/ (layer violation)", bad)


def test_validation_does_not_import_pipelines():
    """pipelines/ and validation/ import each other one way only: pipelines/ → validation/."""
    _, imports = _project_scan()
    bad = [imp for imp in imports if _top(imp.src) == "validation" and _top(imp.target) == "pipelines"]
    assert not bad, _report(
        "validation/ must not import pipelines/ (pipelines/ imports validation/: one direction only)", bad
    )


def test_pipelines_import_lm_eval_only_in_functions():
    _, imports = _project_scan()
    bad = [
        imp
        for imp in imports
        if _top(imp.src) == "pipelines" and _top(imp.target) == "lm_eval" and imp.where != "in a function"
    ]
    assert not bad, _report("pipelines/ imports lm-eval only inside functions (build workers lack it)", bad)


def test_no_import_circles():
    modules, imports = _project_scan()
    graph = graph_of(modules, imports)
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, (
        f"{len(circles)} import circle(s) among the project's modules (imports anywhere in a file count):"
        + describe_cycles(graph, circles)
    )


# --------------------------------------------------------------------------------------------
# Folders: a package's members are its modules and its subpackages, each subpackage taken whole

TRAINING_LAYERS = 9


def packages_of(modules: dict[str, Path]) -> list[str]:
    """Every package (a folder with __init__.py), and "" for the project's top level."""
    return ["", *sorted(m for m, path in modules.items() if path.name == "__init__.py")]


def members_graph(modules, imports, package: str) -> dict[str, dict[str, list[Import]]]:
    """The import graph among `package`'s members ("": the project's top packages): each of its
    modules, and each of its subpackages taken whole (an import of any module under one is an edge of
    that member). The package's own __init__.py is no member (every one is import-free)."""

    def member(name: str) -> str | None:
        if package and (name == package or not _within(name, package)):
            return None
        rest = name[len(package) + 1 :] if package else name
        return (f"{package}." if package else "") + rest.partition(".")[0]

    graph: dict[str, dict[str, list[Import]]] = {}
    for src, targets in graph_of(modules, imports).items():
        a = member(src)
        if a is None:
            continue
        edges = graph.setdefault(a, defaultdict(list))
        for dst, imps in targets.items():
            b = member(dst)
            if b is not None and b != a:
                edges[b] += imps
    return graph


def longest_chain(graph: dict[str, dict[str, list]]) -> list[str]:
    """The longest chain of imports of an acyclic graph, from its top member down: as many members as
    the graph has layers (a member stands one layer above the highest it imports)."""
    below: dict[str, list[str]] = {}  # member -> the longest chain from it down
    for node in sorted(graph):
        stack = [node]
        while stack:
            top = stack[-1]
            pending = [c for c in sorted(graph[top]) if c in graph and c not in below]
            if pending:
                stack += pending[:1]
                continue
            stack.pop()
            chains = [below[c] for c in graph[top] if c in below]
            below[top] = [top, *max(chains, key=len, default=[])]
    return max(below.values(), key=len, default=[])


def test_no_folder_level_loops():
    """At every folder, its modules and subfolders (each taken whole) import each other without a
    loop: a module of a lower folder never needs one of a higher folder, even without a file circle."""
    modules, imports = _project_scan()
    found = []
    for package in packages_of(modules):
        graph = members_graph(modules, imports, package)
        loops = [c for c in strongly_connected(graph) if len(c) > 1]
        if loops:
            found.append(f"in {package or 'the project'}:" + describe_cycles(graph, loops, "members"))
    assert not found, "folder-level import loops (imports anywhere in a file count):\n" + "\n".join(found)


def test_training_stands_on_at_most_9_layers():
    """training/'s members stand on at most TRAINING_LAYERS layers: the longest chain of imports among
    its modules and folders has at most that many members (issue 48 untied one of 12)."""
    modules, imports = _project_scan()
    graph = members_graph(modules, imports, "training")
    assert not [c for c in strongly_connected(graph) if len(c) > 1], "a loop: see test_no_folder_level_loops"
    chain = longest_chain(graph)
    assert len(chain) <= TRAINING_LAYERS, (
        f"training/ stands on {len(chain)} layers (at most {TRAINING_LAYERS}): " + " -> ".join(chain)
    )


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_folder_members_loops_and_layers(tmp_path):
    """The folder rules themselves: two folders whose files import each other's other files have no
    file circle but a folder loop; the layers are the longest chain's members."""
    files = {
        "training/__init__.py": "",
        "training/top.py": "from training.a import x\n",
        "training/low.py": "",
        "training/a/__init__.py": "",
        "training/a/x.py": "from training.b import y\n",
        "training/a/w.py": "from training import low\n",
        "training/b/__init__.py": "",
        "training/b/y.py": "from training import low\n",
        "training/b/z.py": "def f():\n    from training.a import w\n",
    }
    write_tree(tmp_path, files)
    modules, imports = scan(tmp_path, ("training",))
    assert not [c for c in strongly_connected(graph_of(modules, imports)) if len(c) > 1]
    graph = members_graph(modules, imports, "training")
    assert set(graph) == {"training.top", "training.low", "training.a", "training.b"}
    assert [c for c in strongly_connected(graph) if len(c) > 1] == [["training.a", "training.b"]]
    assert members_graph(modules, imports, "training.a") == {"training.a.x": {}, "training.a.w": {}}
    (tmp_path / "training/b/z.py").write_text("")  # the loop untied: top -> a -> b -> low, a -> low
    modules, imports = scan(tmp_path, ("training",))
    graph = members_graph(modules, imports, "training")
    assert not [c for c in strongly_connected(graph) if len(c) > 1]
    assert longest_chain(graph) == ["training.top", "training.a", "training.b", "training.low"]
    assert packages_of(modules) == ["", "training", "training.a", "training.b"]


def test_scanner_resolves_relative_and_submodule_imports(tmp_path):
    """The scan itself: relative imports, `from pkg import submodule`, local imports, SCCs."""
    files = {
        "pipelines/__init__.py": "",
        "pipelines/a.py": "from . import b\nfrom .b import thing\nfrom pipelines import c, VALUE\n",
        "pipelines/b.py": "def f():\n    from pipelines.sub import d\n",
        "pipelines/c.py": "import importlib\nimportlib.import_module('training.model')\n",
        "pipelines/sub/__init__.py": "from .. import a\nfrom . import d\n",
        "pipelines/sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n",
        "training/__init__.py": "",
        "training/model.py": "",
    }
    write_tree(tmp_path, files)
    modules, imports = scan(tmp_path)
    edges = {(i.src, i.target, i.where) for i in imports}
    assert edges == {
        ("pipelines.a", "pipelines.b", "top level"),
        ("pipelines.a", "pipelines.c", "top level"),
        ("pipelines.a", "pipelines", "top level"),  # VALUE is a name in pipelines/__init__.py
        ("pipelines.b", "pipelines.sub.d", "in a function"),
        ("pipelines.c", "importlib", "top level"),
        ("pipelines.c", "training.model", "top level"),
        ("pipelines.sub", "pipelines.a", "top level"),
        ("pipelines.sub", "pipelines.sub.d", "top level"),
        ("pipelines.sub.d", "typing", "top level"),
        ("pipelines.sub.d", "pipelines.a", "under TYPE_CHECKING"),
    }
    graph = graph_of(modules, imports)
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert circles == [["pipelines.a", "pipelines.b", "pipelines.sub.d"]]
    assert shortest_cycle(graph, circles[0]) == [*circles[0], "pipelines.a"]
