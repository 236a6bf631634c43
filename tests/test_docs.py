"""The README and docs/ stay consistent: the options page is generated from
config.py, every page is reachable from the README, the README stays short,
and every link points at a file of the repository.

Fast: reads markdown and imports lazy_mlir.config only (no compiles)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

# [text](target) and [text]: target; images too. Code spans are removed first.
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _markdown_files() -> list[Path]:
    return [README, *_pages()]


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _links(path: Path) -> list[str]:
    prose = _prose(path.read_text())
    return _INLINE_LINK.findall(prose) + _REF_LINK.findall(prose)


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None  # http:, https:, mailto:


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _load_options_table():
    spec = importlib.util.spec_from_file_location("options_table", ROOT / "tools" / "options_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_page_is_the_generated_table():
    table = _load_options_table()
    expected = table.render()
    actual = (DOCS / "options.md").read_text()
    assert actual == expected, (f"docs/options.md is not what tools/options_table.py makes of config.py; "
                                f"regenerate it: {table.COMMAND}")


def test_every_docs_page_is_linked_from_the_readme():
    assert _pages(), "docs/ has no pages"
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _links(README)
              if not _is_external(t) and t.split("#")[0]}
    missing = [p.name for p in _pages() if p.resolve() not in linked]
    assert not missing, f"README.md links no docs/ page named {missing}"


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): "
                                            "move detail into a docs/ page and link it")


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files_of_the_repository(path):
    broken = []
    for target in _links(path):
        if _is_external(target):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            broken.append(f"{target} (absolute path)")
            continue
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        if ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{target} (outside the repository)")
        elif not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{path.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_path_points_outside_the_repository(path):
    text = path.read_text()
    outside = sorted({m.group(0) for m in re.finditer(r"\.\./shared\S*|(?<![\w.])/work/\S*", text)})
    assert not outside, f"{path.relative_to(ROOT)} names paths outside the repository: {outside}"
    for target in _links(path):
        if not _is_external(target):
            assert not target.startswith("../") or (path.parent / target).resolve().is_relative_to(ROOT), target
