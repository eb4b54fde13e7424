"""Every relative link in README.md, docs/*.md and the papers' READMEs points at a file that exists and, where it
names an anchor (`page.md#section`), at a heading of that page: splitting or renaming a page cannot leave a dead
link. Anchors are GitHub's: the heading's text lower-cased, punctuation dropped, spaces as hyphens, "-1", "-2"
after repeats."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "experiments").glob("*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without code blocks and inline code, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6} +(.*?) *#* *$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


def test_anchors_follow_github():
    text = "# Config groups (`conf/` — a link)\n## Tables\n```\n# not a heading\n```\n## Tables\n"
    assert anchors(text) == {"config-groups-conf--a-link", "tables", "tables-1"}


def test_the_pages_exist():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "docs/reliability.md", "docs/performance.md", "docs/design_decisions.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    dead = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            dead.append(f"{target}: no heading with that anchor in {file.relative_to(REPO).as_posix()}")
    assert not dead, f"{page.relative_to(REPO).as_posix()}: " + "; ".join(dead)


DECISIONS = REPO / "docs" / "design_decisions.md"
SRC_FILES = sorted(p for p in (REPO / "src").rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())
# "design decision(s) n[-m]", and the section it names when a link follows: ", docs/design_decisions.md#x" or
# ", [docs](design_decisions.md#x)".
CITATION = re.compile(r"design decisions? (\d+)(?:-(\d+))?"
                      r"(?:,\s*(?:\[docs\]\()?(?:docs/)?design_decisions\.md#([\w-]+))?")


def numbered_decisions() -> dict[int, str]:
    """Decision number -> the anchor of the section of docs/design_decisions.md that writes it."""
    found, section = {}, None
    for line in FENCE.sub("", DECISIONS.read_text(encoding="utf-8")).splitlines():
        if line.startswith("## "):
            section = next(iter(anchors(line)))
        elif m := re.match(r"(\d+)\. ", line):
            assert int(m.group(1)) not in found, f"design decision {m.group(1)} is written twice"
            found[int(m.group(1))] = section
    return found


def test_design_decisions_are_cited_by_numbers_and_sections_that_exist():
    # The decisions are written once (docs/design_decisions.md); code, configs and pages cite them by number and
    # section. A citation of a number the page does not have, or under another section's anchor, is a dead link.
    written = numbered_decisions()
    assert set(written) == set(range(1, 29)), sorted(written)
    files = [*SRC_FILES, *sorted((REPO / "tests").rglob("*.py")), *PAGES]
    dead = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            first, last, anchor = int(m.group(1)), int(m.group(2) or m.group(1)), m.group(3)
            where = f"{path.relative_to(REPO).as_posix()}: {m.group(0)!r}"
            if not all(n in written for n in range(first, last + 1)):
                dead.append(f"{where}: no such decision")
            elif anchor is not None and anchor != written[first]:
                dead.append(f"{where}: decision {first} is under #{written[first]}")
    assert not dead, "; ".join(dead)


def test_no_citation_of_notes_outside_the_repository():
    # "SEMANTICS n" named the team's notes, which are not in the repository: a reader could not follow it.
    cited = [p.relative_to(REPO).as_posix() for p in [*SRC_FILES, *sorted((REPO / "tests").rglob("*.py"))]
             if p.name != Path(__file__).name and re.search(r"SEMANTICS\b", p.read_text(encoding="utf-8"))]
    assert not cited

