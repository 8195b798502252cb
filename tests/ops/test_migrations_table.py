"""docs/reference/migrations.md lists every migration of every app, each with whether it
is online or blocking and whether it goes in before or after the deploy."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "migrations.md"
ROW = re.compile(
    r"^\| `(\w+/migrations/\d{4}_\w+\.py)` \| [^|]+ \| (\*\*blocking\*\*|online) \| ([^|]+) \| [^|]+ \|$", re.M
)
WHEN = re.compile(r"before|after|either|before, with every process stopped")


def migration_files(root: Path) -> set[str]:
    """Every migration of every app (a package's migrations/NNNN_name.py)."""
    return {path.relative_to(root).as_posix() for path in root.glob("*/migrations/[0-9][0-9][0-9][0-9]_*.py")}


def listed(page: str) -> dict[str, tuple[str, str]]:
    return {path: (lock, when.strip()) for path, lock, when in ROW.findall(page)}


def unlisted(files: set[str], page: str) -> list[str]:
    return sorted(files - set(listed(page)))


def test_every_migration_has_a_row():
    files = migration_files(ROOT)
    page = PAGE.read_text()
    rows = listed(page)
    assert {"ledger", "payments", "webhooks"} <= {f.split("/")[0] for f in files}
    assert not unlisted(files, page), "migrations missing from docs/reference/migrations.md"
    assert not sorted(set(rows) - files), "rows for migrations that do not exist"
    assert not [path for path, (_, when) in rows.items() if not WHEN.fullmatch(when)]
    # Every row of the table is one the pattern read (none mistyped and skipped).
    assert len(rows) == len(re.findall(r"^\| `\w+/migrations/", page, re.M))


def test_a_migration_without_a_row_is_reported(tmp_path):
    """The check can fail: a new migration file the page does not list is named."""
    for path in migration_files(ROOT):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    new = tmp_path / "webhooks" / "migrations" / "0099_something_new.py"
    new.touch()
    assert unlisted(migration_files(tmp_path), PAGE.read_text()) == ["webhooks/migrations/0099_something_new.py"]
