"""Every link between the repository's pages, and every citation of a results page or report
by its heading, leads somewhere: a moved file or a renamed heading fails here, not in a
reader's browser. Citations name a file and a heading (`docs/benchmarks/<date>-<name>.md,
"<heading>"`), never a section number, which moves whenever a section is added."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

from tests.helpers import REPO_ROOT

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# `BENCHMARKS.md, "Heading"` or `docs/benchmarks/2026-11-29-dry-run.md, "Heading"`, in any file;
# a citation may break its line (a comment, a docstring) anywhere, so whitespace runs count
# as one space.
_CITATION = re.compile(r"((?:docs/benchmarks/[\w.-]+|BENCHMARKS)\.md),\s+\"([^\"]+)\"")
_THIS_FILE = Path(__file__).resolve()
_SECTION_NUMBER = re.compile(r"BENCHMARKS(?:\.md)?,? (?:section|§) ?\d", re.IGNORECASE)


def _tracked(*patterns: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", *patterns], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO_ROOT / name for name in listed if (REPO_ROOT / name).is_file()]


def _outside_code_blocks(path: Path) -> list[tuple[int, str]]:
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


@cache
def headings(path: Path) -> tuple[str, ...]:
    """The page's headings' texts, in order (code blocks left out)."""
    return tuple(
        match.group(1).strip()
        for _, line in _outside_code_blocks(path)
        if (match := re.match(r"^#{1,6} (.*)$", line))
    )


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors GitHub makes for the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    made = set()
    for heading in headings(path):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        made.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    # and the anchors a page sets itself (`<a id="table-3-2"></a>`, docs/thesis.md)
    made.update(re.findall(r'<a id="([^"]+)"', path.read_text()))
    return frozenset(made)


def test_every_link_between_pages_leads_to_a_file_and_heading() -> None:
    broken = []
    for page in _tracked("*.md"):
        for number, line in _outside_code_blocks(page):
            for href in _LINK.findall(line):
                if re.match(r"^[a-z]+:", href):  # https:, mailto:: the web's business
                    continue
                path, _, fragment = href.partition("#")
                target = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(REPO_ROOT)}:{number}: {href}"
                if not target.exists():
                    broken.append(f"{where} (no such file)")
                elif fragment and (target.is_dir() or fragment not in anchors(target)):
                    broken.append(f"{where} (no such heading)")
    assert broken == []


def test_every_citation_of_a_report_names_a_heading_it_has() -> None:
    broken, cited = [], 0
    for path in _tracked():
        # this file's examples of a citation cite nothing
        if path.suffix not in {".md", ".py", ".yaml", ".sh", ".toml"} or path == _THIS_FILE:
            continue
        # A comment's line breaks: its `#`s are not part of the heading it cites.
        text = re.sub(r"\s+", " ", re.sub(r"\n\s*#", "\n", path.read_text()))
        for name, heading in _CITATION.findall(text):
            cited += 1
            target = REPO_ROOT / name
            if not target.exists():
                broken.append(f"{path.relative_to(REPO_ROOT)}: {name} (no such file)")
            elif heading not in headings(target):
                broken.append(
                    f'{path.relative_to(REPO_ROOT)}: {name}, "{heading}" (no such heading)'
                )
    assert cited > 100  # the pattern still finds the citations (215 when written)
    assert broken == []


def test_no_file_cites_a_section_by_its_number() -> None:
    numbered = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in _tracked()
        if path.suffix in {".md", ".py", ".yaml", ".sh", ".toml"} and path != _THIS_FILE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _SECTION_NUMBER.search(line)
    ]
    assert numbered == []
