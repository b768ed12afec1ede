"""The documentation keeps its promises: links resolve, every `tokenwire serve` flag is
documented and every documented one exists, `console` sessions run, the README stays short.

Pages checked: README.md and docs/*.md (not subfolders). The helpers are tested on small
inline pages first, so a check that passes is a check that can fail."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

import pytest

from gateway.cli import serve

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 250

# A fence opens with 3+ backticks or tildes; any indentation, so fences in list items count.
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
# A run of N backticks up to the next run of exactly N, never across a blank line.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); the text may hold one level of brackets,
# as in a badge: [![alt](img.svg)](page.md).
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*([^)\s]*)[^)]*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
BACKTICKED_FLAG = re.compile(r"`(--[a-z0-9-]+)")
SERVE = re.compile(r"\btokenwire\s+serve\b(.*)")
# Where a `tokenwire serve` command ends: &, &&, |, ||, ;, redirections.
SHELL_OPERATOR = re.compile(r"[&|;<>]")


class Block(NamedTuple):
    """A fenced code block: the line of its opening fence, its info string, its lines."""
    line: int
    info: str
    lines: list[str]


def split_fences(text: str) -> tuple[str, list[Block]]:
    """The prose (fenced lines blanked, so line numbers hold) and the fenced blocks.
    A block closes at a fence of its own character, at least as long, with no info
    string; an unclosed block runs to the end of the page, as CommonMark has it."""
    prose, blocks, fence = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and not match:
            prose.append(line)
            continue
        prose.append("")
        if fence is None:
            fence = match[1]
            blocks.append(Block(number, match[2].strip(), []))
        elif match and match[1][0] == fence[0] and len(match[1]) >= len(fence) \
                and not match[2].strip():
            fence = None
        else:
            blocks[-1].lines.append(line)
    return "\n".join(prose), blocks


def prose_without_code(text: str) -> str:
    """The page with fenced blocks and inline code spans blanked, newlines kept."""
    prose, _ = split_fences(text)
    return CODE_SPAN.sub(lambda m: "\n" * m[0].count("\n"), prose)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, trim, drop all but letters, digits,
    spaces, hyphens and underscores, then each space becomes a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower().strip()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page defines: heading slugs (a repeat gets -1, -2, ...) and the ids
    and names of <a> tags."""
    found = set(HTML_ANCHOR.findall(prose_without_code(text)))
    seen: set[str] = set()
    # Headings keep their code spans: GitHub slugs the text inside the backticks too.
    for heading in HEADING.findall(split_fences(text)[0]):
        # GitHub slugs the rendered text: a link shows its text, a tag shows nothing.
        rendered = re.sub(r"<[^>]+>", "", LINK.sub(r"\1", heading))
        slug = base = github_slug(rendered)
        suffix = 0
        while slug in seen:
            suffix += 1
            slug = f"{base}-{suffix}"
        seen.add(slug)
    return found | seen


def link_problem(page: Path, target: str, root: Path) -> str | None:
    """Why a link from page does not resolve; None when it does, or when it is a URL."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:  # http(s):, mailto: and other URLs are not checked
        return None
    path = unquote(parts.path)
    if not path:
        file = page
    else:  # a leading / is the repository root, as on GitHub
        file = root / path.lstrip("/") if path.startswith("/") else page.parent / path
    if not file.resolve().is_relative_to(root.resolve()):
        return "outside the repository (broken on a code host)"
    if not file.exists():
        return "no such file"
    anchor = unquote(parts.fragment)
    if anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
        return f"no heading or <a> anchor #{anchor} in {file.name}"
    return None


def link_problems(page: Path, root: Path) -> list[str]:
    """'page: target -> reason' for each link on the page, outside code, that is broken."""
    name = page.relative_to(root)
    problems = []
    for _, target in LINK.findall(prose_without_code(page.read_text())):
        reason = link_problem(page, target, root)
        if reason:
            problems.append(f"{name}: {target} -> {reason}")
    return problems


def cli_flags() -> set[str]:
    """Every long option of `tokenwire serve`, less argparse's own --help."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return {opt for action in parser._actions for opt in action.option_strings  # noqa: SLF001
            if opt.startswith("--") and opt != "--help"}


def undocumented(flags: set[str], docs_text: str) -> list[str]:
    """Flags never written as backticked text; --no-x counts as documented by --x."""
    documented = set(BACKTICKED_FLAG.findall(docs_text))
    return sorted(f for f in flags
                  if f not in documented and f.replace("--no-", "--", 1) not in documented)


def table_flags(text: str) -> list[str]:
    """The backticked flags in the first cell of each Markdown table row."""
    flags = []
    # Only fenced code is dropped: the flags themselves are code spans in the cells.
    for row in split_fences(text)[0].splitlines():
        if row.lstrip().startswith("|"):
            first_cell = re.split(r"(?<!\\)\|", row.strip())[1]
            flags += BACKTICKED_FLAG.findall(first_cell)
    return flags


def serve_flags(block: Block) -> list[tuple[int, str]]:
    """(line, flag) for each --flag on a `tokenwire serve` command in a fenced block."""
    found, command, start = [], "", None
    for offset, line in enumerate(block.lines, 1):
        command, start = command + line, start or block.line + offset
        if line.endswith("\\"):  # continues on the next line
            command = command[:-1] + " "
            continue
        command = re.sub(r"(^|\s)#.*", "", command)  # a shell comment
        serve = SERVE.search(command)
        if serve:
            arguments = SHELL_OPERATOR.split(serve[1])[0]
            found += [(start, flag) for flag in re.findall(r"(?<!\S)(--[a-z0-9-]+)", arguments)]
        command, start = "", None
    return found


def console_commands(block: Block) -> list[str]:
    """The commands of a shell session: `$ ` lines, with their backslash continuations;
    every other line is example output."""
    commands, continuing = [], False
    for line in block.lines:
        if continuing:
            commands[-1] += "\n" + line
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        continuing = line.endswith("\\")
    return commands


def run_session(commands: list[str]) -> subprocess.CompletedProcess:
    """One `bash -e` for the whole block, so a `cd` or a variable carries to the next
    command; on CPU, with this venv's tools first on PATH."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_WAIT_POLICY="PASSIVE",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-e", "-c", "\n".join(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def console_blocks() -> list:
    """A pytest param per `console` block, with an id naming its page and fence line."""
    return [pytest.param(block, id=f"{page.relative_to(ROOT)}:{block.line}")
            for page in PAGES for block in split_fences(page.read_text())[1]
            if block.info == "console"]


# --- the helpers, on small inline pages ------------------------------------------------

def test_slug_drops_punctuation_and_numbers_repeats():
    assert github_slug(" `tokenwire serve` flags: a/b (c.d), e_f-g ") == \
        "tokenwire-serve-flags-ab-cd-e_f-g"
    page = ("# Limits\n```sh\n# Limits\n```\n## Limits\n## Limits\n### The `--port` flag ##\n"
            "<a id='x'></a> `<a id='in-code'></a>`\n")
    assert anchors(page) == {"limits", "limits-1", "limits-2", "the---port-flag", "x"}


def test_link_problems_are_all_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n## Twice\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n[ok](other.md#twice-1) [ok](#top) [web](https://x.invalid/y) ![img](other.md)\n"
        "[gone](missing.md) [bad](other.md#twice-2) [self](#nowhere) [out](../x.md)\n"
        "`[code](missing.md)` and\n```\n[fenced](missing.md)\n```\n")
    assert link_problems(page, tmp_path) == [
        "page.md: missing.md -> no such file",
        "page.md: other.md#twice-2 -> no heading or <a> anchor #twice-2 in other.md",
        "page.md: #nowhere -> no heading or <a> anchor #nowhere in page.md",
        "page.md: ../x.md -> outside the repository (broken on a code host)"]


def test_flags_named_in_tables_and_serve_lines_are_found():
    table = ("| flag | meaning |\n|---|---|\n"
             "| `--port`, `--host` / `--no-such-flag` | x `--not-me` |\n")
    assert table_flags(table) == ["--port", "--host", "--no-such-flag"]
    text = ("```sh\n$ tokenwire serve --port 1 \\\n    --no-such-flag=3 # --in-comment\n"
            "tokenwire serve --host h & curl --fail x\ncurl --url y  # tokenwire serve --z\n```\n")
    block = split_fences(text)[1][0]
    assert serve_flags(block) == [(2, "--port"), (2, "--no-such-flag"), (4, "--host")]


def test_a_no_flag_is_documented_by_its_positive_form():
    flags = {"--no-prefix-caching", "--port", "--host"}
    assert undocumented(flags, "`--prefix-caching` and `--port 8`") == ["--host"]


def test_console_session_runs_its_commands_in_one_shell():
    text = "```console\n$ cd tests \\\n  && X=1\nsome output\n$ test -d docs && test $X = 1\n```\n"
    block = split_fences(text)[1][0]
    assert console_commands(block) == ["cd tests \\\n  && X=1", "test -d docs && test $X = 1"]
    assert run_session(console_commands(block)).returncode == 0
    assert run_session(["false", "true"]).returncode != 0


# --- the real pages --------------------------------------------------------------------

def test_links_and_anchors_resolve():
    problems = [problem for page in PAGES for problem in link_problems(page, ROOT)]
    assert problems == [], "broken links:\n" + "\n".join(problems)


def test_every_cli_flag_is_documented():
    docs_text = "\n".join(page.read_text() for page in PAGES if page.parent == ROOT / "docs")
    missing = undocumented(cli_flags(), docs_text)
    assert missing == [], f"`tokenwire serve` flags missing from docs/*.md: {missing}"


def test_configuration_table_names_only_real_flags():
    if not CONFIGURATION.exists():
        pytest.fail(f"{CONFIGURATION.relative_to(ROOT)} does not exist: it is where the "
                    "table of `tokenwire serve` flags lives")
    unknown = sorted(set(table_flags(CONFIGURATION.read_text())) - cli_flags())
    assert unknown == [], f"docs/configuration.md names flags the CLI lacks: {unknown}"


def test_serve_command_lines_use_real_flags():
    known = cli_flags() | {"--help"}
    unknown = [f"{page.relative_to(ROOT)}:{line}: {flag}"
               for page in PAGES for block in split_fences(page.read_text())[1]
               for line, flag in serve_flags(block) if flag not in known]
    assert unknown == [], "`tokenwire serve` lines with flags the CLI lacks:\n" + \
        "\n".join(unknown)


@pytest.mark.parametrize("block", console_blocks())
def test_console_block_runs(block):
    result = run_session(console_commands(block))
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n"
        f"--- stderr\n{result.stderr[-4000:]}")


def test_readme_is_a_front_door():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; keep it under " \
        f"{README_MAX_LINES} and move detail to docs/"
