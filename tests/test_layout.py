"""The layout's rules, checked on the source (docs/architecture.md says why each holds)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

HARNESS = ROOT / "harness"
MAX_FUNCTION_LINES = 80
# Who may import the emulator: the CLI wiring (commands/) and the runner that starts it.
EMULATOR_IMPORTERS = ("harness/cli.py", "harness/runner.py", "harness/commands/", "harness/emulator/")


def modules() -> Iterator[tuple[str, ast.Module]]:
    for f in sorted(HARNESS.rglob("*.py")):
        yield str(f.relative_to(ROOT)), ast.parse(f.read_text(encoding="utf-8"))


def harness_imports(tree: ast.Module) -> Iterator[tuple[str, list[str]]]:
    """(module, names imported from it) for every import of a harness module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name.startswith("harness"))


def test_no_function_is_longer_than_80_lines() -> None:
    long = [
        f"{path}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_no_module_imports_a_private_name_of_another() -> None:
    found = []
    for path, tree in modules():
        imported_modules = set()
        for module, names in harness_imports(tree):
            found += [f"{path}: from {module} import {n}" for n in names if n.startswith("_") and n[:2] != "__"]
            imported_modules |= {n for n in names if not n[:1].isupper()}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in imported_modules
            ):
                found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []


def test_only_the_cli_wiring_and_the_runner_import_the_emulator() -> None:
    found = [
        f"{path}: {module}"
        for path, tree in modules()
        if not path.startswith(EMULATOR_IMPORTERS)
        for module, names in harness_imports(tree)
        if module.startswith("harness.emulator") or (module == "harness" and "emulator" in names)
    ]
    assert found == []


def _published_numbers() -> set[float]:
    """Every figure of the reference file that could be mistaken for no other constant."""
    ref = tomllib.loads((HARNESS / "reference" / "redbooks-md260021.toml").read_text(encoding="utf-8"))
    out: set[float] = set()

    def walk(v: object) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str):
            try:
                walk(float(v))
            except ValueError:
                return
        elif isinstance(v, int | float) and not isinstance(v, bool) and (v >= 1000 or v != int(v)):
            out.add(float(v))

    for table in ("ttft", "concurrency", "competing_traffic", "model_kv"):
        walk(ref[table])
    # The claims (56x, 22x, 18 %) are small integers: they count whatever way they are written.
    return out | {float(v) for v in ref["claims"].values()}


def test_no_published_figure_is_written_outside_the_reference_file() -> None:
    published = _published_numbers()
    assert {32.14, 4.26, 73728.0, 56.0} <= published
    found = [
        f"{path}:{node.lineno}: {node.value}"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and float(node.value) in published
    ]
    assert found == []


def test_every_workload_kind_has_its_three_parts_each_in_its_layer() -> None:
    """A built-in kind's spec sits in config/kinds/, its figures in analysis/kinds/ and its driver in
    workloads/<kind>.py: what reads a scenario, a report or a gate imports neither the wire nor the
    runtime (test_reading_imports_nothing_that_sends)."""
    from harness.analysis.kinds import Figures, figures_of
    from harness.config import kinds
    from harness.workloads.kind import Driver, driver

    for name, module in kinds.BUILTIN.items():
        spec = kinds.get(name)
        assert module == f"harness.config.kinds.{name}" and spec.name == name, name
        assert spec.config.__module__ == module and spec.config.parse.__qualname__.startswith(spec.config.__name__)
        assert package_of(spec.figures.partition(":")[0]) == "harness.analysis", spec.figures
        assert spec.driver == f"harness.workloads.{name}:DRIVER", spec.driver
        assert isinstance(figures_of(name), Figures)
        drive = driver(name)
        assert isinstance(drive, Driver) and drive.config is spec.config


def test_no_code_reaches_a_private_attribute_of_another_object() -> None:
    """No `x._name` where x is not self or cls: another package's privates would tie kvbench to
    its internals and pin its version (issue 29: aiohttp's once did). In harness/ as a whole, the
    wire package included."""
    allowed = {("os", "_exit")}  # the standard library's documented way out of a forked child
    found = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner in ("self", "cls") or (owner, node.attr) in allowed:
                    continue
                found.append(f"{path}:{node.lineno}: .{node.attr}")
    assert found == []


def _kind_names(node: ast.expr) -> list[str]:
    """The built-in workload kind names a comparison's operand spells out."""
    from harness.config import kinds

    if isinstance(node, ast.Constant) and node.value in kinds.BUILTIN:
        return [str(node.value)]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for e in node.elts for n in _kind_names(e)]
    return []


KIND_PARTS = ("harness/workloads/", "harness/config/kinds/", "harness/analysis/kinds/")


def test_no_workload_kind_is_compared_outside_its_own_parts() -> None:
    """The runner, statistics, progress, report and gate ask a kind (its methods and declared
    sections), never which kind it is: a new kind is one module (docs/architecture.md)."""
    found = [
        f"{path}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in modules()
        if not path.startswith(KIND_PARTS)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(_kind_names(x) for x in (node.left, *node.comparators))
    ]
    assert found == []


# The packages from the bottom up (docs/architecture.md): a module imports only from its own
# package or from those listed before it. The emulator stands apart: it imports only the pure
# cores (it is a server kvbench runs against, never a client).
LAYERS = (
    "harness.core",
    "harness.results",
    "harness.inputs",
    "harness.config",
    "harness.wire",
    "harness.server",
    "harness.analysis",
    "harness.sizing",
    "harness.monitor",
    "harness.traffic",
    "harness.engines",
    "harness.workloads",
    "harness.distributed",
    "harness.runner",
    "harness.report",
    "harness.gate",
    "harness.commands",
    "harness.cli",
)
STANDALONE = {"harness.emulator": ("harness.core", "harness.config", "harness.results", "harness.analysis")}


def package_of(module: str) -> str:
    """The layer a dotted module name belongs to ("harness" itself and __main__: the top)."""
    for name in (*LAYERS, *STANDALONE):
        if module == name or module.startswith(name + "."):
            return name
    return "harness.cli"


def imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a harness module, at any depth: in a function (run
    late) and under `if TYPE_CHECKING:` (for the types: a cycle there is one in the design) too.
    `from harness import x` imports the module harness.x; `from harness import __version__`
    reads the version, no module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("harness"):
            if node.module == "harness":
                submodules = [
                    a.name for a in node.names if (HARNESS / a.name).exists() or (HARNESS / f"{a.name}.py").exists()
                ]
                yield from ((node.lineno, f"harness.{name}") for name in submodules)
            else:
                yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.startswith("harness"))


def registry_imports() -> Iterator[tuple[str, int, str]]:
    """The imports the kinds registry makes by name (config/kinds/__init__.py `get` and `part`):
    each built-in spec's module from the config layer, its figures from analysis/kinds, its
    driver from workloads/kind.py (the modules that call `part` for them)."""
    from harness.config import kinds

    for name, module in kinds.BUILTIN.items():
        spec = kinds.get(name)
        yield "harness/config/kinds/__init__.py", 0, module
        yield "harness/analysis/kinds/__init__.py", 0, spec.figures.partition(":")[0]
        yield "harness/workloads/kind.py", 0, spec.driver.partition(":")[0]


def test_imports_run_one_way_between_every_pair_of_packages() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = []
    found = [(path, line, module) for path, tree in modules() for line, module in imports(tree)]
    for path, line, module in [*found, *registry_imports()]:
        own = package_of(path.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        to = package_of(module)
        if to == own:
            continue
        if own in STANDALONE:
            ok = to in STANDALONE[own]
        elif to in STANDALONE:  # who starts the emulator: the test above
            ok = path.startswith(EMULATOR_IMPORTERS)
        else:
            ok = rank[to] < rank[own]
        if not ok:
            wrong.append(f"{path}:{line}: {own} imports {module}")
    assert wrong == []


def test_every_package_is_placed_and_described() -> None:
    """A new package gets its place in the order above and its line in docs/architecture.md."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.parent.name for p in HARNESS.glob("*/__init__.py"))
    placed = {n.removeprefix("harness.") for n in (*LAYERS, *STANDALONE)}
    assert set(packages) <= placed, set(packages) - placed
    assert [p for p in packages if f"`{p}/`" not in doc] == []


READING = """
import sys
import harness.analysis, harness.config, harness.gate, harness.report
from harness.cli import app
for args in sys.argv[1:]:
    try:
        code = app(args.split("|"), standalone_mode=False)
    except SystemExit as e:
        code = e.code
    assert not code, (args, code)
SENDS = ("harness.wire", "harness.distributed", "harness.workloads")
print("imported:", *sorted(m for m in sys.modules if m.startswith(SENDS)))
"""


def test_reading_a_scenario_a_report_or_a_gate_imports_nothing_that_sends(tmp_path: Path) -> None:
    """Issue 54: validate, report and gate on a shipped result, in a fresh interpreter, leave the
    wire, the distribution layer and the kinds' drivers unimported."""
    runs = ROOT / "tests" / "golden" / "runs"
    rules = tmp_path / "rules.toml"
    rules.write_text('[gate.thresholds]\nttft_s = ["p99 < 1000"]\n', encoding="utf-8")
    commands = [
        "validate|scenarios/redbooks-ttft-sweep.toml",
        "validate|scenarios/trace-replay.toml",
        "validate|scenarios/multi-turn-sessions.toml",
        "validate|scenarios/kv-tier-capacity.toml",
        "validate|scenarios/redbooks-concurrency.toml",
        f"report|{runs / 'golden-loop'}|--output|{tmp_path / 'r.html'}",
        f"gate|{runs / 'golden-loop'}|--rules|{rules}|--json|{tmp_path / 'g.json'}",
    ]
    out = subprocess.run(
        [sys.executable, "-c", READING, *commands], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").exists() and (tmp_path / "g.json").exists()
    assert out.stdout.splitlines()[-1].split() == ["imported:"]


def test_no_test_monkeypatches_a_module_global_of_harness() -> None:
    """What a test changes of kvbench's behaviour it passes in (a parameter, an object), never by
    rewriting a harness module's global (issue 54): `monkeypatch.setattr` and `setitem` on a
    harness module, or on a "harness..." dotted target, are refused."""
    import importlib.util

    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
                for alias in node.names:
                    try:  # a module of a package, not a name defined in a module
                        is_module = importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                    except (ModuleNotFoundError, AttributeError):
                        is_module = False
                    if is_module:
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("harness")}
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("setattr", "setitem", "delattr")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "monkeypatch"
                and node.args
            ):
                continue
            target = node.args[0]
            if (isinstance(target, ast.Name) and target.id in modules) or (
                isinstance(target, ast.Constant) and str(target.value).startswith("harness")
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert not found


def test_the_wire_keeps_no_mutable_state_of_its_own_at_module_level() -> None:
    """Issue 54: the wire's state is owned by the client that made it (its parse budget, its
    patterns), never a module's: every global of a harness.wire module is a module, a function
    (memoised or not: a cache of a pure function's answers changes none), a class, a typing
    construct or a value that cannot change (numbers, strings, bytes, tuples and frozensets of
    them, compiled patterns and structs, frozen dataclasses, named tuples, and context variables,
    whose value is each task's own); and nothing lowers the interpreter's switch interval, which
    is a whole process's."""
    import dataclasses
    import importlib
    import inspect
    import re
    import struct
    import typing
    from contextvars import ContextVar

    def frozen(v: object) -> bool:
        if v is None or isinstance(v, int | float | str | bytes | re.Pattern | struct.Struct | ContextVar):
            return True
        if isinstance(v, tuple | frozenset):  # (a named tuple too)
            return all(frozen(x) for x in v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return type(v).__dataclass_params__.frozen and all(  # type: ignore[attr-defined]
                frozen(getattr(v, f.name)) for f in dataclasses.fields(v)
            )
        return (
            inspect.ismodule(v)
            or inspect.isroutine(inspect.unwrap(v))
            or isinstance(v, type)
            or typing.get_origin(v) is not None
            or type(v).__module__ in ("typing", "__future__")  # Any, Literal, `annotations`
        )

    found = []
    for f in sorted((HARNESS / "wire").glob("*.py")):
        assert "setswitchinterval" not in f.read_text(encoding="utf-8"), f.name
        module = importlib.import_module(f"harness.wire.{f.stem}" if f.stem != "__init__" else "harness.wire")
        found += [
            f"{f.name}: {name}"
            for name, v in vars(module).items()
            if name != "__all__" and not name.startswith("__") and not frozen(v)
        ]
    assert not found
