"""The README stays short, and every relative link in README.md and docs/*.md resolves (issue 37
part 10): the file exists and, for a ``#anchor``, a heading of that file has that GitHub slug."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_WORDS = 3600
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"\!\[[^\]]*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code blanked (a link in code is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown file, duplicates numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    # and each HTML anchor (BENCHMARKS.md's rows: <a id="..."></a>, which docs link to)
    out: set[str] = set(re.findall(r'<a id="([^"]+)"></a>', path.read_text(encoding="utf-8")))
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        links += LINK.findall(line) + IMAGE.findall(line)
    return [t for t in links if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, mailto:, file: ...


def test_the_readme_is_at_most_3600_words():
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_README_WORDS, (
        f"README.md has {words} words (at most {MAX_README_WORDS}): move reference into docs/ and leave a link")


def test_the_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first = text.index("```sh")
    block = text[first:text.index("```", first + 5)]
    assert "./scripts/demo" in block and "./scripts/test" in block, block


def test_every_relative_link_in_the_readme_and_docs_resolves():
    bad = []
    for doc in DOCS:
        for target in relative_links(doc):
            file, _, anchor = target.partition("#")
            dest = doc if not file else (doc.parent / unquote(file)).resolve()
            if not dest.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no heading with that anchor in {dest.name})")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_slugs_are_githubs():
    assert slug("The live page: `[web] listen`") == "the-live-page-web-listen"
    assert slug("Batch schedulers and orchestrators: Slurm, Kubernetes, torchrun") == \
        "batch-schedulers-and-orchestrators-slurm-kubernetes-torchrun"
    assert slug("Install: an environment of its own") == "install-an-environment-of-its-own"
    assert slug("The demo (`./scripts/demo`)") == "the-demo-scriptsdemo"
