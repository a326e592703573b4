"""The front door stays a front door: README and the results index stay short, every relative
link in them, in docs/ and in benchmarks/ points at a file that exists, and every raw result
file is named in benchmarks/results/INDEX.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks").rglob("*.md")),
]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_readme_is_at_most_200_lines():
    assert lines(ROOT / "README.md") <= 200


def test_benchmarks_index_is_at_most_300_lines():
    assert lines(ROOT / "BENCHMARKS.md") <= 300


def relative_targets(path: Path) -> list[str]:
    """Link targets of a Markdown file that are files in this repository (no URL, no pure
    anchor), with any #anchor cut off."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not a link
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(page):
    missing = [t for t in relative_targets(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_the_link_check_sees_links():
    assert "docs/install.md" in relative_targets(ROOT / "README.md")


def test_every_raw_result_file_is_named_in_the_index():
    results = ROOT / "benchmarks" / "results"
    index = (results / "INDEX.md").read_text()
    unnamed = [
        p.name
        for p in sorted(results.iterdir())
        if p.name != "INDEX.md" and f"`{p.name}`" not in index
    ]
    assert not unnamed, f"benchmarks/results/INDEX.md does not name: {unnamed}"


# A policy or preset name as the docs write it: tiny-*, mt10*-*, or a preset of a real shape.
NAME = re.compile(r"`((?:tiny|mt10[a-z]?)-[a-z0-9-]+)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_policy_name_the_docs_mention_exists(page):
    """`vlarun X` / `vlarun bench X` in any code block names a command, and every
    `tiny-*` / `mt10*-*` name in backticks is a preset or a shipped policy (issue 45, 8: the
    docs called shipped policies "not shipped" and omitted presets)."""
    from vlarun.cli import BENCH, COMMANDS
    from vlarun.models.presets import PRESETS
    from vlarun.paths import RETIRED, shipped_policies

    text = page.read_text()
    known = set(PRESETS) | set(shipped_policies()) | set(RETIRED)  # history names them too
    unknown = sorted({n for n in NAME.findall(text) if n not in known and not n.endswith("-")})
    assert not unknown, f"{page.relative_to(ROOT)} names unknown policies/presets: {unknown}"
    commands = set()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    for block in (body for lang, body in blocks if lang in ("", "bash", "sh", "console")):
        for m in re.finditer(r"(?:^|[\s;&|(])vlarun ((?:bench )?[a-z][a-z-]*)", block):
            commands.add(m.group(1))
    bad = sorted(
        c for c in commands if not (c in COMMANDS or (c.startswith("bench ") and c[6:] in BENCH))
    )
    assert not bad, f"{page.relative_to(ROOT)} runs unknown commands: {bad}"


def _tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every markdown table: the text before it (since the previous table or heading), its
    header cells (lower case) and its rows' cells."""
    out, lines = [], text.splitlines()
    i, since = 0, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            since = i
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            cells = lambda row: [c.strip() for c in row.strip().strip("|").split("|")]  # noqa: E731
            header = [c.lower() for c in cells(line)]
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            out.append(("\n".join(lines[since:i]), header, rows))
            since, i = j, j
            continue
        i += 1
    return out


def _row_problems(text: str) -> list[str]:
    """What the tables of a BENCHMARKS-like page leave out: per table, a command, machine or
    date neither in a column (filled in every row) nor named once in the text above it (since
    the last heading). The one table that only lists what the old diary said is exempt."""
    problems = []
    for above, header, rows in _tables(text):
        if header[0] == "the old diary said":
            continue
        for what, found in (
            ("command", re.search(r"`vlarun |`python |command", above, re.I)),
            ("machine", re.search(r"machine|intel|amd|epyc|xeon", above, re.I)),
            ("date", re.search(r"\d{4}-\d{2}-\d{2}", above)),
        ):
            cols = [k for k, h in enumerate(header) if what in h]
            if cols:
                empty = [r[0][:40] for r in rows if len(r) <= cols[0] or not r[cols[0]]]
                if empty:
                    problems.append(f"table '{header[0]}': rows without a {what}: {empty}")
            elif not found:
                problems.append(f"table '{header[0]}': no {what} column and none named above")
    return problems


def test_every_benchmarks_row_names_a_command_a_machine_and_a_date():
    """Each result in BENCHMARKS.md says how to reproduce it, where and when (issue 45, 8)."""
    problems = _row_problems((ROOT / "BENCHMARKS.md").read_text())
    assert not problems, "\n".join(problems)


def test_the_benchmarks_row_check_sees_what_is_missing():
    page = "## x\n\n| a | command | machine |\n|---|---|---|\n| 1 | `vlarun x` | |\n"
    assert _row_problems(page) == [
        "table 'a': rows without a machine: ['1']",
        "table 'a': no date column and none named above",
    ]
    dated = "## x\nDate: 2026-12-05.\n\n| a | command | machine |\n|---|---|---|\n| 1 | c | m |\n"
    assert _row_problems(dated) == []


# A figure the docs quote links to the page (and section) that measured it: a link whose text
# holds a number, into BENCHMARKS.md or benchmarks/*.md.
LABELLED = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section(path: Path, anchor: str) -> str | None:
    """The text under the heading whose anchor is ``anchor`` (to the next heading of its level
    or above); the whole page without an anchor; None where no heading has it."""
    text = path.read_text().splitlines()
    if not anchor:
        return "\n".join(text)
    for i, line in enumerate(text):
        m = re.match(r"(#+)\s+(.*)", line)
        if m and slug(m.group(2)) == anchor:
            out = []
            for rest in text[i + 1 :]:
                h = re.match(r"(#+)\s", rest)
                if h and len(h.group(1)) <= len(m.group(1)):
                    break
                out.append(rest)
            return "\n".join(out)
    return None


def quoted_figures(page: Path) -> list[str]:
    """Each figure ``page`` quotes with a link to a results page that does not say it there:
    'label -> target: why'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    bad = []
    for label, target in LABELLED.findall(text):
        file, _, anchor = target.partition("#")
        if "://" in target or not NUMBER.search(label) or not file.endswith(".md"):
            continue
        dest = (page.parent / file).resolve()
        if dest.name != "BENCHMARKS.md" and dest.parent.name != "benchmarks":
            continue
        body = section(dest, anchor) if dest.exists() else None
        if body is None:
            bad.append(f"{label} -> {target}: no such page or section")
            continue
        missing = [n for n in NUMBER.findall(label) if n not in body]
        if missing:
            bad.append(f"{label} -> {target}: {', '.join(missing)} not in that section")
    return bad


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_figure_the_docs_quote_is_on_the_section_it_links_to(page):
    """Issue 63, 6: docs that cannot drift. A figure quoted in README.md or docs/ links to the
    section of BENCHMARKS.md or benchmarks/ that measured it, and is there."""
    bad = quoted_figures(page)
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_figure_check_sees_a_figure_that_drifted(tmp_path):
    results = tmp_path / "benchmarks"
    results.mkdir()
    (results / "engine.md").write_text("# Engine\n\n## Current\n\n1.22x\n\n## History\n\n1.90x\n")
    page = tmp_path / "README.md"
    page.write_text(
        "decode [1.22x](benchmarks/engine.md#current), [1.90x](benchmarks/engine.md"
        "#current), [2x](benchmarks/engine.md#nowhere), [here](benchmarks/engine.md)"
    )
    assert quoted_figures(page) == [
        "1.90x -> benchmarks/engine.md#current: 1.90 not in that section",
        "2x -> benchmarks/engine.md#nowhere: no such page or section",
    ]
