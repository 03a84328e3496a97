"""The documentation's links resolve inside the repository.

Every relative link in README.md, docs/**/*.md and charts/**/README.md must name a file or
folder that exists, and a `#anchor` into a markdown file must name one of its headings, slugged
as GitHub slugs them. External http(s) and mailto links are not fetched. Paths written in
backticks that start at a top-level folder of this repository (`operator/...`, `e2e/...`,
`benchmarks/...`, `charts/...`, `crds/...`) must exist too.
"""

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be <bracketed> and carry a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
REPO_PATH = re.compile(r"^(operator|e2e|benchmarks|charts|crds)/[A-Za-z0-9_./-]*$")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "charts").rglob("README.md"))]
    return [f for f in files if f.is_file()]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): the rendered text in lower case,
    punctuation other than '-' and '_' dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors a markdown file offers: its headings' slugs (a repeated slug gets -1, -2, ...)
    and explicit <a name|id> anchors."""
    seen: Counter[str] = Counter()
    found = set()
    for _, line in prose_lines(path):
        if match := HEADING.match(line):
            base = slug(match.group(2))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
        found.update(HTML_ANCHOR.findall(line))
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link outside code."""
    found = []
    for number, line in prose_lines(path):
        line = CODE_SPAN.sub("", line)
        targets = [*INLINE_LINK.findall(line), *REFERENCE_DEFINITION.findall(line)]
        found.extend((number, t[1:-1] if t.startswith("<") else t) for t in targets)
    return found


def code_paths(path: Path) -> list[tuple[int, str]]:
    """(line, path) of every backticked path that starts at a top-level folder of the repository."""
    found = []
    for number, line in prose_lines(path):
        for _, span in CODE_SPAN.findall(line):
            if REPO_PATH.match(span.strip()):
                found.append((number, span.strip()))
    return found


def broken_link(source: Path, target: str) -> str | None:
    """Why `target`, linked from `source`, does not resolve; None when it does."""
    if EXTERNAL.match(target):
        return None
    file_part, _, anchor = target.partition("#")
    if file_part:
        base = ROOT if file_part.startswith("/") else source.parent
        resolved = (base / file_part.lstrip("/")).resolve()
        if not resolved.is_relative_to(ROOT):
            return "points outside the repository"
        if not resolved.exists():
            return "no such file"
    else:
        resolved = source
    if anchor and resolved.suffix == ".md" and resolved.is_file() and anchor not in anchors(resolved):
        return f"no heading with anchor #{anchor} in {resolved.relative_to(ROOT)}"
    return None


def problems(path: Path) -> list[str]:
    name = path.relative_to(ROOT)
    found = [f"{name}:{number}: ({target}) {why}" for number, target in links(path)
             if (why := broken_link(path, target))]
    found += [f"{name}:{number}: `{code}` does not exist" for number, code in code_paths(path)
              if not (ROOT / code).exists()]
    return found


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(path: Path) -> None:
    assert problems(path) == []


def test_the_check_sees_the_docs() -> None:
    """The walk finds the docs and their links, so an empty result above means something."""
    files = doc_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "api.md" in files
    assert sum(len(links(f)) for f in files) > 50


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Inference-aware routing (InferencePool)", "inference-aware-routing-inferencepool"),
    ("`llmfleet plan -f FILE [-o json|table]`", "llmfleet-plan--f-file--o-jsontable"),
    ("`status.conditions[]`", "statusconditions"),
    ("Faults it survives (tested in e2e)", "faults-it-survives-tested-in-e2e"),
    ("The `tensorrt_llm` model", "the-tensorrt_llm-model"),
    ("Scale: 1,000 deployments", "scale-1000-deployments"),
])
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_broken_links_are_reported(tmp_path: Path) -> None:
    """A missing file, a missing anchor and a link escaping the repository are each caught;
    external links, code and existing targets are not."""
    doc = ROOT / "docs" / "x.md"  # resolved relative to docs/, never written
    assert broken_link(doc, "operator.md#conditions") is None
    assert broken_link(doc, "../README.md") is None
    assert broken_link(doc, "https://example.invalid/nowhere") is None
    assert broken_link(doc, "nowhere.md") == "no such file"
    assert broken_link(doc, "operator.md#nowhere").startswith("no heading")
    assert broken_link(doc, "../../outside.md") == "points outside the repository"
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n`[x](gone.md)`\n\n```\n[y](gone.md)\n```\n[z](b.md \"title\")\n",
                    encoding="utf-8")
    assert links(page) == [(8, "b.md")]
