"""The docs a newcomer meets: README answers the first questions and links the rest, perf.md is
a page of current figures (each dated, with host, commit and command) with its history kept
apart, and raw results live in bench-results/, each described."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"\b[0-9a-f]{7}\b")


def _sections(path: Path, level: str = "## ") -> dict[str, str]:
    """Heading -> body of each section at `level` (code blocks included)."""
    out, head, body = {}, None, []
    for line in path.read_text().splitlines():
        if line.startswith(level):
            if head is not None:
                out[head] = "\n".join(body)
            head, body = line[len(level):].strip(), []
        elif head is not None:
            body.append(line)
    if head is not None:
        out[head] = "\n".join(body)
    return out


def test_readme_links_the_docs_and_documents_the_cpu_api():
    text = (ROOT / "README.md").read_text()
    for doc in ("docs/design.md", "docs/tuning.md", "docs/diagnostics.md", "docs/perf.md"):
        assert f"]({doc})" in text, doc
    assert "path/to/file.py:function" in text
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    cpu = [b for b in blocks if not b.lstrip().startswith("# gpu")]
    assert any("emulate(" in b and "check(" in b for b in cpu)


def test_no_results_or_charts_inside_docs():
    stray = [p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".json", ".png")]
    assert not stray


def test_bench_results_readme_describes_every_file():
    folder = ROOT / "bench-results"
    text = (folder / "README.md").read_text()
    names = [p.name for p in folder.iterdir() if p.name != "README.md"]
    assert names
    for name in names:
        assert re.fullmatch(r"20\d\d-\d\d-\d\d-[0-9a-f]{7}-[\w-]+\.(json|png)", name), name
        stem = re.sub(r"-run\d\.json$", "-run", name)
        assert name in text or stem in text, f"{name} is not described in bench-results/README.md"


def test_perf_page_has_method_and_reproduction():
    sections = _sections(ROOT / "docs" / "perf.md")
    assert "Method" in sections and "How to reproduce" in sections
    method = sections["Method"]
    for topic in ("back to back", "median", "power cap", "same run", "floor"):
        assert topic in method.lower().replace("back-to-back", "back to back"), topic
    assert "```bash" in sections["How to reproduce"]


FIGURES = [h for h in _sections(ROOT / "docs" / "perf.md")
           if h not in ("Hosts", "Method", "How to reproduce")]


@pytest.mark.parametrize("heading", FIGURES)
def test_every_figure_says_date_host_commit_and_command(heading):
    body = _sections(ROOT / "docs" / "perf.md")[heading]
    assert DATE.search(body), "no date"
    assert COMMIT.search(body), "no commit"
    assert re.search(r"H[12]00", body), "no host"
    assert "```" in body or re.search(r"`(tilelink|python|bash) [^`]+`", body), "no command"


def test_perf_pages_use_no_work_log_numbering():
    for name in ("perf.md", "perf-history.md"):
        text = (ROOT / "docs" / name).read_text()
        assert not re.search(r"\b[Ss]ession" + r"s? \d", text), name


# another project's issue, cited for what it says (a test's comment on DeepEP's proxy fence)
OTHER_PROJECTS = re.compile(r"\b(DeepEP|PyTorch|torch|Triton|NCCL|NVSHMEM)\b")


def test_the_repository_cites_no_work_item_of_its_own():
    # docs, tools and code speak of the project by date and commit, never by a work item's
    # number (the word "issue", a number)
    pattern = re.compile(r"\b[Ii]ssues? #?\d+\b")
    found = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                 *(ROOT / "tools").iterdir(), *(ROOT / "tilelink").rglob("*.py"),
                 *(ROOT / "examples").rglob("*"), *(ROOT / "tests").rglob("*.py")]:
        if not path.is_file() or path.suffix not in (".md", ".py", ".sh", ".tl"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not OTHER_PROJECTS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_history_entries_are_dated():
    heads = list(_sections(ROOT / "docs" / "perf-history.md"))
    assert len(heads) >= 5
    for head in heads:
        assert DATE.match(head), head
    assert heads == sorted(heads, key=lambda h: DATE.match(h).group(0))  # oldest first
