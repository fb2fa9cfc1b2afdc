"""Prose lives in docs/ (issue 29 item 4): module docstrings of at most 15 lines, conf/ files that carry the command
and one-line reasons (comment lines at most 25% of conf/'s non-blank lines), and every docs/ page that code or a
config file points to exists."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_DOCSTRING_LINES = 15
MAX_CONF_COMMENT_SHARE = 0.25
DOCS_LINK = re.compile(r"(?<![\w/.-])docs/[\w./-]*?\.md")


def python_files() -> list[Path]:
    return sorted([*ROOT.glob("grpo_lab/**/*.py"), ROOT / "run.py", *ROOT.glob("hydra_plugins/**/*.py")])


def docstring_lines(source: str) -> int:
    """Lines the module docstring spans in the file, its quotes included (0 without one)."""
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def comment_share(texts: list[str]) -> float:
    """Lines whose first non-blank character is '#', over the non-blank lines (the issue's count)."""
    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    return sum(line.lstrip().startswith("#") for line in lines) / len(lines)


def doc_links(text: str) -> set[str]:
    return {m.rstrip(".") for m in DOCS_LINK.findall(text)}


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_docstring_is_short(path):
    n = docstring_lines(path.read_text())
    assert n <= MAX_DOCSTRING_LINES, f"{path.relative_to(ROOT)}: a {n}-line docstring; its prose goes to docs/"


def test_conf_comments_are_at_most_a_quarter():
    share = comment_share([p.read_text() for p in sorted((ROOT / "conf").rglob("*.yaml"))])
    assert share <= MAX_CONF_COMMENT_SHARE, f"{share:.1%} of conf/'s non-blank lines are comments"


def test_every_docs_page_pointed_to_exists():
    sources = [*python_files(), *(ROOT / "conf").rglob("*.yaml"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    missing = {(link, str(p.relative_to(ROOT))) for p in sources for link in doc_links(p.read_text())
               if not (ROOT / link).is_file()}
    assert not missing, sorted(missing)


def test_the_checks_find_planted_faults():
    long_doc = '"""' + "line\n" * 20 + '"""\nx = 1\n'
    assert docstring_lines(long_doc) == 21 and docstring_lines("x = 1\n") == 0
    assert comment_share(["# a\n# b\nkey: 1\n\n"]) == pytest.approx(2 / 3)
    assert doc_links("see docs/memory_plan.md. and benchmarks/docs/x.md") == {"docs/memory_plan.md"}
