"""The READMEs run as written: every ```bash block of ``README.md`` and of
``feature_repo/README.md`` is executed, in order, in a fresh clone layout.

Conventions the READMEs follow (and the parser below holds them to):

- a command block is a fence opened with ```bash (indented fences in lists
  too); ```sh, ```shell and ```console are refused, so no block escapes the
  test by its language tag;
- a block that is not meant to run says so, with its reason, in an HTML
  comment on the line before the fence: ``<!-- not run: needs a GPU -->``;
- every other block runs with ``bash -euo pipefail`` from the clone's root,
  after the blocks above it, and must exit 0. A README is read in one
  terminal: the files and the exported variables of a block stay for the
  blocks after it (``feature_repo/README.md`` starts from a fresh shell, on
  the files ``README.md`` left). Long-running commands are bounded in the README itself
  (``--idle-seconds``, ``--max-steps``, a background broker the last block
  stops).

The clone is the tracked and untracked-not-ignored files (``git ls-files
-co --exclude-standard``, so uncommitted work is tested too) copied into
tmp_path, with ``.venv`` and ``.tools`` linked in (what ``make install``
would have built) and the shared data folder beside it for the MovieLens
data. The
only text the test changes is in :data:`SUBSTITUTIONS` (fixed ports become
free ones on this shared machine).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "feature_repo/README.md")
BLOCK_TIMEOUT_S = 900
OUTPUT_TAIL_LINES = 60

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run\b(?P<rest>.*?)-->\s*$")
_REFUSED_LANGS = {"sh", "shell", "console", "zsh"}


@dataclass(frozen=True)
class Block:
    """One ```bash block: where it is, its text, and why not, if not run."""

    readme: str
    line: int
    text: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.readme}:{self.line}"


def parse_blocks(readme: str, markdown: str) -> list[Block]:
    """The ```bash blocks of one README, in order.

    Raises:
        ValueError: a refused language tag, an unclosed fence, or a
            ``not run`` marker without a reason.
    """
    lines = markdown.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        lang, indent = opening["lang"], opening["indent"]
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index].removeprefix(indent))
            index += 1
        if index == len(lines):
            raise ValueError(f"{readme}:{start + 1}: the fence never closes")
        index += 1
        if lang in _REFUSED_LANGS:
            raise ValueError(
                f"{readme}:{start + 1}: ```{lang} block; command blocks are ```bash"
            )
        if lang != "bash":
            continue
        blocks.append(
            Block(
                readme, start + 1, "\n".join(body) + "\n", _reason(readme, lines, start)
            )
        )
    return blocks


def _reason(readme: str, lines: list[str], fence: int) -> str | None:
    """The reason of a ``<!-- not run: ... -->`` right above the fence."""
    above = fence - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    marker = _NOT_RUN.match(lines[above]) if above >= 0 else None
    if not marker:
        return None
    reason = marker["rest"].strip().removeprefix(":").strip()
    if not reason:
        raise ValueError(f"{readme}:{above + 1}: 'not run' needs a reason")
    return reason


def readme_blocks(root: Path = REPO_ROOT) -> list[Block]:
    return [
        block
        for readme in READMES
        for block in parse_blocks(readme, (root / readme).read_text())
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def substitutions() -> dict[str, str]:
    """README text -> what runs here. Only ports: the READMEs' sizes are
    already small, and a fixed port may be taken by another run on this
    machine."""
    kafka, prometheus, serving = free_port(), free_port(), free_port()
    return {
        "127.0.0.1:9092": f"127.0.0.1:{kafka}",
        "--port 9092": f"--port {kafka}",
        "--prometheus-port 9108": f"--prometheus-port {prometheus}",
        "127.0.0.1:8080": f"127.0.0.1:{serving}",
        "--port 8080": f"--port {serving}",
    }


def fresh_clone(destination: Path) -> Path:
    """The working tree as a fresh clone plus ``make install`` would leave
    it: the files git knows of, ``.venv`` and ``.tools`` linked, the shared
    data folder beside it."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    clone = destination / "repo"
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if not source.is_file():  # listed by git but deleted in the tree
            continue
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for tool in (".venv", ".tools"):
        (clone / tool).symlink_to(REPO_ROOT / tool)
    shared = REPO_ROOT.parent / "shared"
    if shared.exists():
        (destination / "shared").symlink_to(shared)
    return clone


def block_environment(clone: Path) -> dict[str, str]:
    """A user's shell in the clone: the venv's ``python`` first on PATH, the
    clone's packages importable by every tool (the editable install of a
    real clone points at the clone), none of this test process's GEM_* or Kafka
    variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GEM_", "KAFKA_", "FEAST_", "PYTEST_"))
    }
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(clone)
    env.pop("VIRTUAL_ENV", None)
    return env


def in_one_terminal(script: str, exports: Path) -> str:
    """``script`` run after the exports of the blocks before it, leaving
    its own (also when it fails) for the next."""
    return (
        f"if [ -f {exports} ]; then source {exports}; fi\n"
        f"trap 'export -p >{exports}' EXIT\n{script}"
    )


def stop_process_groups(groups: list[int]) -> None:
    """Stop what the blocks left running (a background broker), politely
    first; each group is one block's shell and its children."""
    for signum, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
        alive = []
        for group in groups:
            try:
                os.killpg(group, signum)
                alive.append(group)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [group for group in alive if _group_alive(group)]
        groups = alive


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def test_readme_blocks_follow_the_convention() -> None:
    blocks = readme_blocks()
    runnable = [block for block in blocks if block.not_run is None]
    # Both READMEs have blocks the walk-through runs: a parse that found
    # none would make the run below vacuous.
    assert {block.readme for block in runnable} == set(READMES)
    for block in blocks:
        assert block.text.strip(), f"{block.where}: empty block"


def test_parse_blocks_reads_markers_and_refuses_other_tags() -> None:
    markdown = (
        "```bash\necho one\n```\n\n<!-- not run: needs a GPU -->\n"
        "```bash\nnvidia-smi\n```\n\n  ```bash\n  echo indented\n  ```\n"
        "```json\n{}\n```\n"
    )
    blocks = parse_blocks("X.md", markdown)
    assert [(b.text, b.not_run) for b in blocks] == [
        ("echo one\n", None),
        ("nvidia-smi\n", "needs a GPU"),
        ("echo indented\n", None),
    ]
    with pytest.raises(ValueError, match="command blocks are ```bash"):
        parse_blocks("X.md", "```console\n$ ls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        parse_blocks("X.md", "<!-- not run -->\n```bash\nls\n```\n")


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_readme_commands_run_as_written(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    blocks = readme_blocks(clone)
    env = block_environment(clone)
    replace = substitutions()
    groups: list[int] = []
    failures: list[str] = []
    summary: list[str] = []
    try:
        for number, block in enumerate(blocks):
            if block.not_run is not None:
                summary.append(f"not run  {block.where}: {block.not_run}")
                continue
            script = block.text
            for written, used in replace.items():
                script = script.replace(written, used)
            exports = tmp_path / f"exports-{READMES.index(block.readme)}.sh"
            log = tmp_path / f"block-{number:02d}.log"
            started = time.monotonic()
            with log.open("wb") as output:
                shell = subprocess.Popen(
                    [
                        "bash",
                        "-euo",
                        "pipefail",
                        "-c",
                        in_one_terminal(script, exports),
                    ],
                    cwd=clone,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                groups.append(shell.pid)
                try:
                    code = shell.wait(timeout=BLOCK_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    stop_process_groups([shell.pid])
                    code = shell.wait()
            seconds = time.monotonic() - started
            summary.append(f"exit {code:<4} {block.where} ({seconds:.0f} s)")
            if code != 0:
                failures.append(
                    f"--- {block.where} exited {code} after {seconds:.0f} s:\n"
                    f"{script}--- last lines of its output:\n{_tail(log)}\n"
                )
    finally:
        stop_process_groups(groups)
    print("", *summary, sep="\n")
    assert not failures, "\n".join(failures)
