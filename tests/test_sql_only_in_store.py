"""No module outside harness/store/ issues SQL (issue 38: one reader in store/).

Every Python module of harness/, dashboard/ and plugins/ is parsed; outside
harness/store/ none may call ``.execute``, ``.executemany``, ``.sql`` or
``.query`` on anything, nor hold a string (or the text an f-string starts with)
that begins with a SQL statement's keyword. The scan is checked on planted
cases so that it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("harness", "dashboard", "plugins")
EXEMPT = ROOT / "harness" / "store"
SQL_CALLS = {"execute", "executemany", "sql", "query"}
SQL_START = re.compile(r"^\s*\(?\s*(SELECT|INSERT|CREATE|DELETE|UPDATE|WITH|DROP|ALTER|SHOW|DESCRIBE|PRAGMA"
                       r"|ATTACH|COPY)\b")
# SQL as this project writes it (keywords in capitals); a keyword alone is not a statement: it needs more after it
_STATEMENT = re.compile(r"^\s*\(?\s*(SELECT\s+[\w*\"(]+.*\bFROM\b|SELECT\s+(count|DISTINCT|\*)|INSERT\s+INTO|"
                        r"CREATE\s+(TABLE|INDEX|VIEW|SEQUENCE|OR)|DELETE\s+FROM|UPDATE\s+\w+\s+SET|"
                        r"WITH\s+\w+\s+AS\s*\(|DROP\s+(TABLE|INDEX|VIEW)|ALTER\s+TABLE|SHOW\s+TABLES|"
                        r"DESCRIBE\s+\w+|PRAGMA\s+\w+|ATTACH\s|COPY\s+\w+\s+(TO|FROM))", re.DOTALL)


def _leading_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # an f-string: its text up to the first placeholder, then a stand-in
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    return None


def sql_in(source: str) -> list[tuple[int, str]]:
    """(line, what) of every SQL call or SQL string in ``source``."""
    found: dict[tuple[int, str], str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_CALLS:
            found.setdefault((node.lineno, "call"), f".{node.func.attr}(")
        text = _leading_text(node)
        if text is not None and SQL_START.match(text) and _STATEMENT.match(text):
            found.setdefault((node.lineno, "text"), text.strip().splitlines()[0][:60])
    return [(line, what) for (line, _), what in sorted(found.items())]


def _modules():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if EXEMPT not in path.parents:
                yield path


def test_the_scan_finds_planted_sql():
    planted = '''
con.execute("x")
df = store.query(sql, params)
rel = con.sql("SELECT 1")
con.executemany(q, rows)
A = """
    SELECT run_id FROM runs WHERE status = ?"""
B = f"SELECT {cols} FROM runs r WHERE {where}"
C = f"INSERT INTO bench ({cols}) VALUES ({marks})"
D = "WITH sel AS (SELECT * FROM runs) SELECT 1"
E = "CREATE TABLE t (a INTEGER)"
'''
    lines = sorted({line for line, _ in sql_in(planted)})
    assert lines == [2, 3, 4, 5, 6, 8, 9, 10, 11]


def test_the_scan_lets_prose_and_other_calls_pass():
    prose = '''
doc = "Select a metric from the list"
msg = f"Update {n} runs with abl ingest"
note = "create the folder first"
x = obj.execute_later()
y = requests.get(url)
'''
    assert sql_in(prose) == []


def test_no_module_outside_store_issues_sql():
    offenders = []
    for path in _modules():
        for line, what in sql_in(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, "SQL outside harness/store/ (move it behind a named function in store/):\n" + \
        "\n".join(offenders)
