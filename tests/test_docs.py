"""The docs cannot rot: every command block marked runnable is run, every relative link resolves,
the README's layout table names only what is there, and the README stays a front page.

A runnable block is a ```bash fence with the line `<!-- runnable -->` right before it. It runs with
bash (-e, pipefail) from the repo root, `.venv/bin` first on PATH, within 60 s, and must exit 0.
When `<!-- output -->` and a fenced block follow it (blank lines between are fine), the command's
output (stdout + stderr) must contain that block; a line that is just `…` in it stands for
anything (the block is abridged), so each stretch between two `…` must appear, in order.
Mark only cheap commands with no side effects (`--help`, `make -n`).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNNABLE = "<!-- runnable -->"
OUTPUT = "<!-- output -->"
ELLIPSIS = "…"
TIMEOUT_SECONDS = 60
README_MAX_LINES = 250
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")

# Docs that must carry at least one runnable block (where a cheap, side-effect-free command exists).
MUST_RUN = [
    "README.md",
    "docs/operate.md",
    "docs/local-stack.md",
    "docs/rehearsal.md",
    "infra/README.md",
    "bootstrap/README.md",
    "bench/README.md",
    "tests/README.md",
    "jobs/README.md",
    *(
        f"jobs/{job}/README.md"
        for job in ("cdc", "ingest", "views", "report", "maintain", "streaming", "gendata", "verify")
    ),
]


def doc_files() -> list[Path]:
    """The Markdown the project publishes (not the venv's, not node_modules')."""
    patterns = [
        "README.md",
        "docs/**/*.md",
        "jobs/**/README.md",
        "infra/README.md",
        "bootstrap/README.md",
        "bench/**/*.md",
        "tests/README.md",
        "lakehouse/**/README.md",
    ]
    found = {path for pattern in patterns for path in REPO.glob(pattern) if path.is_file()}
    return sorted(found)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    code: str
    expected: str | None

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def fenced_blocks(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(opening line index, closing line index, info string, body) of every fenced block."""
    blocks, index = [], 0
    while index < len(lines):
        match = FENCE.match(lines[index].strip())
        if not match:
            index += 1
            continue
        fence, info = match.group(1), match.group(2).strip()
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        blocks.append((index, end, info, "\n".join(lines[index + 1 : end])))
        index = end + 1
    return blocks


def runnable_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    blocks = fenced_blocks(lines)
    found = []
    for position, (start, end, info, body) in enumerate(blocks):
        if start == 0 or lines[start - 1].strip() != RUNNABLE:
            continue
        assert info.split()[:1] == ["bash"], f"{doc}:{start + 1}: a runnable block must be ```bash"
        expected = None
        after = end + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        if after < len(lines) and lines[after].strip() == OUTPUT:
            following = blocks[position + 1] if position + 1 < len(blocks) else None
            assert following is not None and following[0] > after, (
                f"{doc}:{after + 1}: {OUTPUT} without a block"
            )
            assert all(not line.strip() for line in lines[after + 1 : following[0]]), (
                f"{doc}:{after + 1}: {OUTPUT} must be followed by its fenced block"
            )
            expected = following[3]
        found.append(Block(doc, start + 1, body, expected))
    return found


ALL_BLOCKS = [block for doc in doc_files() for block in runnable_blocks(doc)]


def expected_chunks(expected: str) -> list[str]:
    """The stretches of an abridged expected block, split at lines that are just `…`."""
    chunks, current = [], []
    for line in expected.splitlines():
        if line.strip() == ELLIPSIS:
            chunks.append("\n".join(current))
            current = []
        else:
            current.append(line.rstrip())
    chunks.append("\n".join(current))
    return [chunk.strip("\n") for chunk in chunks if chunk.strip()]


def contains_in_order(output: str, chunks: list[str]) -> str | None:
    """None when every chunk is in output in order, else the first chunk that is not."""
    text = "\n".join(line.rstrip() for line in output.splitlines())
    position = 0
    for chunk in chunks:
        found = text.find(chunk, position)
        if found < 0:
            return chunk
        position = found + len(chunk)
    return None


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.name for block in ALL_BLOCKS])
def test_runnable_block_runs(block: Block) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update({"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
    try:
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.name}: still running after {TIMEOUT_SECONDS} s:\n{block.code}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{block.name}: exit {result.returncode}\n{block.code}\n---\n{output[-3000:]}"
    )
    if block.expected is not None:
        missing = contains_in_order(output, expected_chunks(block.expected))
        assert missing is None, f"{block.name}: output lacks\n{missing}\n--- output:\n{output[-3000:]}"


@pytest.mark.parametrize("doc", MUST_RUN)
def test_doc_has_a_runnable_block(doc: str) -> None:
    path = REPO / doc
    assert path.exists(), f"{doc} is missing"
    assert runnable_blocks(path), f"{doc} has no block marked {RUNNABLE}"


def relative_links(doc: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative link outside code (fenced blocks and `inline code`)."""
    lines = doc.read_text().splitlines()
    in_code = set()
    for start, end, _info, _body in fenced_blocks(lines):
        in_code.update(range(start, end + 1))
    links = []
    for number, line in enumerate(lines):
        if number in in_code:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for match in LINK.finditer(prose):
            target = match.group(1) or match.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # a URL; a same-page `#anchor` is checked like any other link
            links.append((number + 1, target))
    return links


def heading_anchors(doc: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (lower case, punctuation dropped, spaces to -)."""
    lines = doc.read_text().splitlines()
    in_code = set()
    for start, end, _info, _body in fenced_blocks(lines):
        in_code.update(range(start, end + 1))
    anchors: set[str] = set()
    for number, line in enumerate(lines):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if number in in_code or not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        unique, count = slug, 1
        while unique in anchors:
            unique, count = f"{slug}-{count}", count + 1
        anchors.add(unique)
    return anchors


@pytest.mark.parametrize("doc", doc_files(), ids=[str(doc.relative_to(REPO)) for doc in doc_files()])
def test_relative_links_resolve(doc: Path) -> None:
    broken = broken_links(doc, REPO)
    assert not broken, "links to paths or headings that do not exist:\n" + "\n".join(broken)


def broken_links(doc: Path, root: Path) -> list[str]:
    broken = []
    for line, target in relative_links(doc):
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path) if path else doc
        if not resolved.exists():
            broken.append(f"{doc.relative_to(root)}:{line}: {target}")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{doc.relative_to(root)}:{line}: {target} (no such heading)")
    return broken


def layout_table() -> list[list[str]]:
    """The first column's backticked paths, per row of the table under the README's `## Layout`."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^##\s+Layout\b", line))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|") or re.match(r"^\|[\s|:-]+\|$", line):
            continue
        first = line.split("|")[1]
        paths = re.findall(r"`([^`]+)`", first)
        if paths:
            rows.append(paths)
    return rows


def test_readme_is_a_front_page() -> None:
    count = len((REPO / "README.md").read_text().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines; at most {README_MAX_LINES}"


def test_layout_table_names_only_paths_that_exist() -> None:
    rows = layout_table()
    assert rows, "README.md has no layout table under '## Layout'"
    missing = [path for row in rows for path in row if not (REPO / path).exists()]
    assert not missing, f"the README's layout table names paths that do not exist: {missing}"


def test_layout_table_names_every_top_level_part_and_every_job() -> None:
    named = {path.rstrip("/") for row in layout_table() for path in row}
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    top_dirs = {name.split("/")[0] for name in tracked.stdout.splitlines() if "/" in name}
    top_dirs -= {".ci"}  # CI's entry point: runs `make test`
    unnamed = sorted(part for part in top_dirs if part not in named)
    assert not unnamed, f"top-level folders the README's layout table does not name: {unnamed}"
    jobs = sorted(f"jobs/{path.parent.name}" for path in (REPO / "jobs").glob("*/__main__.py"))
    assert jobs, "no job packages (jobs/<job>/__main__.py) found"
    unnamed_jobs = [job for job in jobs if job not in named]
    assert not unnamed_jobs, f"jobs the README's layout table does not name: {unnamed_jobs}"
    undocumented = [job for job in jobs if not (REPO / job / "README.md").exists()]
    assert not undocumented, f"jobs without a README.md beside them: {undocumented}"


# The checker itself, on fixed input: a checker that accepts everything proves nothing.


def test_the_checker_finds_runnable_blocks_and_their_output(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n<!-- runnable -->\n```bash\necho one\n```\n\n<!-- output -->\n```text\none\n```\n\n"
        "```bash\nnot runnable\n```\n\n<!-- runnable -->\n```bash\ntrue\n```\n"
    )
    blocks = runnable_blocks(doc)
    assert [(block.line, block.code, block.expected) for block in blocks] == [
        (4, "echo one", "one"),
        (18, "true", None),
    ]


def test_the_checker_matches_abridged_output_in_order() -> None:
    chunks = expected_chunks("Usage: x\n…\n  --a  first\n…\n  --b  second\n")
    assert chunks == ["Usage: x", "  --a  first", "  --b  second"]
    assert contains_in_order("Usage: x\nmore\n  --a  first   \n  --b  second\n", chunks) is None
    assert contains_in_order("Usage: x\n  --b  second\n  --a  first\n", chunks) == "  --b  second"


def test_the_checker_sees_broken_links_but_not_code(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](there.md#part) [gone](missing.md) [web](https://example.com) [anchor](#x)\n"
        "`[in code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
    )
    assert relative_links(doc) == [(1, "there.md#part"), (1, "missing.md"), (1, "#x")]
    # and a same-page anchor with no such heading is reported by the test that resolves them
    doc.write_text("# Only heading\n[fine](#only-heading) [gone](#no-such-heading)\n")
    assert broken_links(doc, tmp_path) == ["doc.md:2: #no-such-heading (no such heading)"]


def test_the_checker_computes_github_heading_anchors(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Deploy (prod)\n## Quickstart: two commands\n## `lakehouse sql`\n## Tests\n## Tests\n")
    assert heading_anchors(doc) == {
        "deploy-prod",
        "quickstart-two-commands",
        "lakehouse-sql",
        "tests",
        "tests-1",
    }
