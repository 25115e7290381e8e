"""The documents speak of the product: no issue numbers, no pointer to a file the repository does not hold."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_FOLDERS = "docs|sim|agents|tests|benchmarks|broker-config|scenarios"
_PATH = re.compile(rf"(?<![\w./-])((?:{_FOLDERS})/[\w./-]*\w|[\w-]+\.md)\b")
_ISSUE = re.compile(r"\bissues? \d+|\bissue-\d+|(?<![\w&])#\d+\b", re.IGNORECASE)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_no_issue_numbers(document: object) -> None:
    text = document.read_text()  # type: ignore[attr-defined]
    found = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if _ISSUE.search(line)]
    assert not found, found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_file_named_is_in_the_repository(document: object) -> None:
    text = document.read_text()  # type: ignore[attr-defined]
    here = document.parent  # type: ignore[attr-defined]
    missing = []
    for link in _LINK.findall(text):
        if "://" not in link and not (here / link).exists():
            missing.append(link)
    for path in _PATH.findall(text):
        if "*" in path or "{" in path:
            continue
        if not ((REPO / path).exists() or (here / path).exists() or (REPO / "docs" / path).exists()):
            missing.append(path)
    assert not missing, sorted(set(missing))


def test_the_checks_see_what_they_are_about() -> None:
    assert _PATH.findall("see DESIGN.md and docs/store.md, sim/cli/run.py.") == ["DESIGN.md", "docs/store.md",
                                                                               "sim/cli/run.py"]
    assert _ISSUE.findall("(issue 4), issues 9 and 16, the issue-6 section, #12") == ["issue 4", "issues 9",
                                                                                    "issue-6", "#12"]
    assert _LINK.findall("[a](docs/x.md#part) and [b](https://example.org)") == ["docs/x.md", "https://example.org"]


def test_docs_architecture_holds_the_generated_import_table() -> None:
    """The import table of docs/architecture.md is the code's, as tests/architecture.py reads it."""
    from tests.architecture import BEGIN, END, PAGE, import_table

    text = PAGE.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] + "\n" == import_table(), "run: python -m tests.architecture --write"
    assert "| `sim.output` |" in import_table() and "| `agents` |" in import_table()
