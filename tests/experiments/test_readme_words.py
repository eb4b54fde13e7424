"""The words of the READMEs held to the verdicts (issue 53, part 4): a verdict written in hand-written prose is
bold and names its claim in a marker right after it, ``**held**<!-- <table>: <claim> -->``, and it must equal
the verdict that the committed records give today (a bold verdict followed by "when" defines the word). A bold
verdict without a marker, or one that the records no longer give, fails: the words cannot drift from the numbers
again. Generated blocks (``make tables``) are skipped: they are the verdicts."""

from __future__ import annotations

import re

import pytest

from tests.committed import ROOT, committed_tables

PAGES = [*sorted((ROOT / "experiments").glob("*/README.md")), ROOT / "README.md", ROOT / "results" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = re.compile(r"<!-- attnlab-(claims|table)[^>]*-->.*?<!-- /attnlab-\1 -->", re.S)
# A bold verdict followed by " when" defines the word (the rule's text), it reports no verdict.
VERDICT = re.compile(r"\*\*(held|not held|inconclusive|not run|untested)\*\*(?! when)(?:<!-- ([^:>]+): (.+?) -->)?")


def verdict_words(text: str) -> list[tuple[str, str | None, str | None]]:
    """(verdict, table, claim) for every bold verdict in the hand-written parts of a page."""
    return [m.groups() for m in VERDICT.finditer(GENERATED.sub("", text))]


def test_verdict_words_are_parsed_with_and_without_markers():
    text = ("a **held**<!-- ut/table7: UT small below UT base --> b **not held** **held** when it lies inside "
            "<!-- attnlab-claims: ut -->**held**<!-- /attnlab-claims -->")
    assert verdict_words(text) == [("held", "ut/table7", "UT small below UT base"), ("not held", None, None)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hand_written_verdicts_match_the_records(page):
    words = verdict_words(page.read_text(encoding="utf-8"))
    if not words:
        return
    verdicts = {(b.spec.name, r.spec.claim): r.status for b, results in committed_tables() for r in results}
    for said, table, claim in words:
        where = f"{page.relative_to(ROOT)}: **{said}**"
        assert table is not None, f"{where} names no claim: write **{said}**<!-- <table>: <claim> -->"
        assert (table, claim) in verdicts, f"{where}: no claim {claim!r} in table {table!r}"
        assert said == verdicts[table, claim], f"{where} but the records give {verdicts[table, claim]} for {claim!r}"
