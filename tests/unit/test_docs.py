"""The user documentation stays what a reader needs: README.md short, README.md and docs/*.md
free of issue numbers and session dates (measurements and their dates live in bench/RESULTS.md),
and every relative link in them pointing at a file that exists and, for a markdown file, at a
heading that exists in it (GitHub's anchors)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target) and ![alt](target); the text may run over lines, the target has no spaces.
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
_DATE = re.compile(r"(?<![\d-])\d{4}-\d{2}-\d{2}(?![\d-])")


def user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks, with each line kept (code lines blanked), so line
    numbers still hold."""
    out, fenced = [], False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def without_code_spans(text: str) -> str:
    """The text with inline code blanked out (its line breaks kept)."""
    return _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text in lower case, without
    punctuation but '-' and '_', spaces made '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    kept = [ch for ch in text.lower()
            if ch in " -_" or unicodedata.category(ch)[0] in "LNM"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")).split("\n"):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of the relative links in a markdown file, outside code."""
    text = without_code_spans(prose(path.read_text(encoding="utf-8")))
    result = []
    for m in _LINK.finditer(text):
        target = m.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
            continue
        result.append((text.count("\n", 0, m.start()) + 1, target))
    return result


def broken_links(path: Path) -> list[str]:
    problems = []
    for line, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor in {dest.name}")
    return problems


def mentions(path: Path) -> list[str]:
    """Issue numbers anywhere, and dates outside code (a log line's or a format's example may
    show one), with their line numbers."""
    text = path.read_text(encoding="utf-8")
    found = [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for m in _ISSUE.finditer(text)]
    outside_code = without_code_spans(prose(text))
    found += [f"{path.name}:{outside_code.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
              for m in _DATE.finditer(outside_code)]
    return found


# ----------------------------------------------------------------------------- the repo's docs

def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): put the detail in docs/")


def test_docs_exist():
    assert len(user_docs()) > 1, "docs/*.md is missing"


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: p.name)
def test_no_issue_numbers_or_dates(path):
    assert mentions(path) == [], (
        "user docs name no issue numbers or session dates (measurements and their dates go to "
        "bench/RESULTS.md)")


@pytest.mark.parametrize("path", [*user_docs(), ROOT / "bench" / "RESULTS.md"], ids=lambda p: p.name)
def test_relative_links_resolve(path):
    assert broken_links(path) == []


# ----------------------------------------------------------------------------- the checks

def test_slug_is_githubs():
    assert slug("Deliberate departures from RabbitMQ 3.10.8") == "deliberate-departures-from-rabbitmq-3108"
    assert slug("Client libraries' upstream suites") == "client-libraries-upstream-suites"
    assert slug("Reliable publishing: `warren.client`") == "reliable-publishing-warrenclient"
    assert slug("Shovels (moving messages)") == "shovels-moving-messages"
    assert slug("Memory and disk alarms") == "memory-and-disk-alarms"
    assert slug("Warren's own") == "warrens-own"
    assert slug("TTL, limits & priorities") == "ttl-limits--priorities"
    assert slug("queue_window and µs") == "queue_window-and-µs"


def test_the_checks_find_what_they_look_for(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## A section\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\n"
        "[ok](other.md#a-section) [ok too](other.md#a-section-1) [self](#title)\n"
        "[missing file](nowhere.md) [missing anchor](other.md#b-section)\n"
        "[over\ntwo lines](#no-such) ![image](img.png) [web](https://example.org/x#y)\n\n"
        "Since issue 17 and on 2026-11-28 this changed; `2026-11-27 09:35:09` is an example.\n\n"
        "```\n[in code](nowhere-either.md)\n# not a heading\n2026-11-26\n```\n",
        encoding="utf-8")
    assert anchors(tmp_path / "other.md") == {"other", "a-section", "a-section-1"}
    problems = broken_links(doc)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "nowhere.md: no such file", "other.md#b-section: no heading with that anchor in other.md",
        "#no-such: no heading with that anchor in doc.md", "img.png: no such file"]
    assert problems[2].startswith(f"{doc}:5:")
    assert [m.split(": ", 1)[1] for m in mentions(doc)] == ["'issue 17'", "'2026-11-28'"]
