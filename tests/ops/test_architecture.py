"""The product's shape, checked from its source (decision record 0015, docs/reference/code-layout.md).

* No import cycle between two files of the product.
* Packages import downward only: each has a rank, and a module may import only packages of
  a lower rank (or its own package). Nothing of the product imports ``devtools`` or
  ``tests``.
* No product file above ``MAX_FILE_LINES`` lines; no package above ``MAX_PACKAGE_SHARE`` of
  the product's Python lines.

Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:``
alike (the product has none of those; a type-only import that closed a cycle would still be
a dependency a reader must follow). The product is every top-level package but ``devtools``
and ``tests``, without its migrations (frozen history, generated).

The checker is plain ``ast`` (no import-linter): the functions below take a folder, so the
tests at the end feed them small trees that break each rule.
"""

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Higher imports lower; the same rank never imports its sibling. Top to bottom:
RANKS = {
    "delaypay": 7,  # the project's configuration: settings, urls, celery, health, /metrics
    "api": 6,  # the HTTP edge
    "console": 6,  # the payments console (the admin of the payments app's models)
    "payouts": 5,  # payees, the payout executor, settlement reconciliation
    "recurring": 5,  # the series
    "webhooks": 5,  # endpoints, the outbox's delivery
    "payments": 4,  # the engine: models, claim, execution, services, selectors
    "rails": 3,  # the rail interface and its HTTP client
    "ledger": 2,  # accounts and transfers
    "common": 1,  # helpers every package shares
}
NOT_PRODUCT = frozenset({"devtools", "tests"})
MAX_FILE_LINES = 800
MAX_PACKAGE_SHARE = 0.35


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (the deepest module of ours the name resolves to)
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def packages(root: Path) -> list[str]:
    """Every top-level package of ``root`` (a folder holding __init__.py)."""
    return sorted(p.parent.name for p in root.glob("*/__init__.py"))


def product_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every product module (migrations left out)."""
    mods = {}
    for package in packages(root):
        if package in NOT_PRODUCT:
            continue
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "migrations" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def imports(root: Path) -> list[Import]:
    """Every import between modules of ``root``'s packages made by a product module, as
    /tmp/arch/graph.py reads them: ``from a import b`` is an import of module ``a.b`` when
    that is a module, else of ``a``."""
    mods = product_files(root)
    ours = set(packages(root))

    def resolve(name: str) -> str | None:
        while name:
            if name in mods:
                return name
            if "." not in name and name in ours:
                return name  # a package outside the product (devtools, tests)
            name = name.rpartition(".")[0]
        return None

    found = []
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = set()
            if isinstance(node, ast.Import):
                targets = {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")
                    if not is_package:
                        parts = parts[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                targets = {resolve(f"{base}.{alias.name}") or resolve(base) for alias in node.names}
            for target in sorted(t for t in targets if t and t != module):
                found.append(Import(module, target, path.relative_to(root), node.lineno))
    return found


def cycles(found: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges = defaultdict(set)
    for imp in found:
        edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return components


def upward_imports(found: list[Import], ranks: dict[str, int]) -> list[Import]:
    """Imports of a package that is not ranked below the importer's (a sibling, a higher
    package, or one outside the product)."""
    wrong = []
    for imp in found:
        source, target = imp.source.split(".")[0], imp.target.split(".")[0]
        if source == target:
            continue
        if target not in ranks or ranks[target] >= ranks[source]:
            wrong.append(imp)
    return wrong


def long_files(root: Path, limit: int) -> list[tuple[Path, int]]:
    counts = [(path.relative_to(root), len(path.read_text().splitlines())) for path in product_files(root).values()]
    return sorted((c for c in counts if c[1] > limit), key=lambda c: -c[1])


def package_lines(root: Path) -> dict[str, int]:
    lines: dict[str, int] = defaultdict(int)
    for module, path in product_files(root).items():
        lines[module.split(".")[0]] += len(path.read_text().splitlines())
    return dict(lines)


def oversized_packages(root: Path, share: float) -> dict[str, float]:
    lines = package_lines(root)
    total = sum(lines.values())
    return {package: n / total for package, n in lines.items() if n / total > share}


# --- the product ------------------------------------------------------------------------


def test_every_product_package_has_a_rank():
    assert sorted(set(packages(ROOT)) - NOT_PRODUCT) == sorted(RANKS), (
        "a new package needs its rank here and in docs/reference/code-layout.md"
    )


def test_no_import_cycle_between_files():
    found = cycles(imports(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_packages_import_downward_only():
    wrong = upward_imports(imports(ROOT), RANKS)
    assert not wrong, "imports of a package not below the importer's:\n" + "\n".join(map(str, wrong))


def test_no_product_file_is_longer_than_the_limit():
    found = long_files(ROOT, MAX_FILE_LINES)
    assert not found, f"files above {MAX_FILE_LINES} lines:\n" + "\n".join(f"{p}: {n}" for p, n in found)


def test_no_package_holds_more_than_its_share():
    found = oversized_packages(ROOT, MAX_PACKAGE_SHARE)
    assert not found, f"packages above {MAX_PACKAGE_SHARE:.0%} of the product's lines: {found}"


def test_the_engine_learns_of_the_packages_above_it_through_their_apps():
    """The inversions of decision 0015 are wired when Django has started."""
    from payments import promoter, services
    from payouts.payees import payout_resolve_failed
    from recurring.services import recurring_generate_due

    assert recurring_generate_due in promoter.FIRST_SHARD_HOOKS
    assert services._parked_payout_resolvers == [payout_resolve_failed]


def test_the_tasks_keep_their_names_wherever_they_live():
    from delaypay.celery import app

    app.loader.import_default_modules()
    names = {name for name in app.tasks if not name.startswith("celery.")}
    assert names == {
        "payments.tasks.promoter_tick", "payments.tasks.execute_batch", "payments.tasks.execute_payouts",
        "payments.tasks.purge_start_markers", "payments.tasks.purge_expired_tokens",
        "payments.tasks.purge_idempotency_keys",
        "payments.tasks.ensure_partitions", "payments.tasks.archive_partitions", "payments.tasks.reconcile_daily",
        "payments.tasks.reconcile_settlement_daily", "webhooks.tasks.dispatch",
        "payments.tasks.process_heartbeat",  # the dashboard's Processes panel (console/dashboard.py)
    }


# --- the checker fails where it should -------------------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def tree(tmp_path):
    """Two packages, low below high, each of a few small modules."""
    return write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "X = 1\n",
        "low/b.py": "from low.a import X\n",
        "high/__init__.py": "",
        "high/c.py": "from low import b\n",
        "devtools/__init__.py": "",
        "devtools/tool.py": "import high.c\n",
        "low/migrations/__init__.py": "",
        "low/migrations/0001_initial.py": "import high.c\n" + "x = 1\n" * 2000,
    })


RANKS_OF_TREE = {"high": 2, "low": 1}


def test_the_clean_tree_passes(tree):
    found = imports(tree)
    assert {(i.source, i.target) for i in found} == {("low.b", "low.a"), ("high.c", "low.b")}
    assert cycles(found) == []
    assert upward_imports(found, RANKS_OF_TREE) == []
    assert long_files(tree, 10) == []


def test_a_cycle_is_found_even_through_a_function_local_import(tree):
    write(tree, {"low/a.py": "X = 1\n\ndef f():\n    from . import b\n"})
    assert cycles(imports(tree)) == [["low.a", "low.b"]]


def test_an_upward_import_is_named_with_its_file_and_line(tree):
    write(tree, {"low/a.py": "X = 1\n\n\ndef f():\n    from high.c import b\n"})
    wrong = upward_imports(imports(tree), RANKS_OF_TREE)
    assert [str(w) for w in wrong] == ["low/a.py:5: low.a imports high.c"]


def test_a_sibling_and_a_tool_are_not_below(tree):
    write(tree, {"side/__init__.py": "", "side/d.py": "import devtools.tool\nfrom high import c\n"})
    wrong = upward_imports(imports(tree), {**RANKS_OF_TREE, "side": 2})
    assert [(w.source, w.target) for w in wrong] == [("side.d", "devtools"), ("side.d", "high.c")]


def test_type_checking_imports_count(tree):
    write(tree, {"low/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from high import c\n"})
    assert [w.target for w in upward_imports(imports(tree), RANKS_OF_TREE)] == ["high.c"]


def test_a_long_file_is_found_and_migrations_are_not(tree):
    write(tree, {"high/c.py": "x = 1\n" * 11})
    assert long_files(tree, 10) == [(Path("high/c.py"), 11)]


def test_a_package_above_its_share_is_found(tree):
    write(tree, {"high/c.py": "x = 1\n" * 9})
    shares = oversized_packages(tree, 0.5)
    assert list(shares) == ["high"] and shares["high"] == pytest.approx(9 / 11)


# Scripts fed to ``manage.py shell``: they work at import, on a scratch database.
SHELL_SCRIPTS = frozenset({"devtools.recurring_cost"})


def test_every_module_of_the_product_and_the_tools_imports():
    """A moved or renamed name breaks the import of the module that still asks for it,
    which ruff does not see and a test run meets only if a test imports that module (a
    benchmark scenario, say)."""
    import importlib
    import pkgutil

    broken = []
    for package in [*RANKS, "devtools"]:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            if ".migrations." in info.name or info.name in SHELL_SCRIPTS:
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # every failure is the finding
                broken.append(f"{info.name}: {exc!r}")
    assert not broken, "\n".join(broken)
