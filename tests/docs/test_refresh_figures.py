"""scripts/refresh_figures.py on temporary pages with a registry of trivial shell commands:
no model and no server, so these run in seconds."""
import datetime
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


blocks = _load("figure_blocks")  # refresh_figures imports it as a sibling module
rf = _load("refresh_figures")

MACHINE = blocks.Machine("Test CPU 9000", "`lscpu` model name", "AVX2", 2, "abc1234")


def stamp(command: str) -> str:
    today = datetime.date.today().isoformat()
    return (f"Measured with `{command}` on a 2-core `Test CPU 9000` (`lscpu` model name; AVX2), "
            f"{today}, commit abc1234:")


def block(name: str, inside: str = "old numbers") -> str:
    return f"<!-- figure: {name} -->\n{inside}\n<!-- /figure -->\n"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repo root with docs/; the machine stamp fixed so pages can be compared exactly."""
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(rf, "describe_machine", lambda repo, found: MACHINE)
    return tmp_path


def run(repo: Path, figures, *argv: str) -> int:
    return rf.main(list(argv), figures=figures, repo=repo)


def test_every_block_of_a_figure_rewritten_from_one_run(repo):
    (repo / "README.md").write_text("# Title\n\n" + block("hello") + "\nafter\n")
    (repo / "docs" / "a.md").write_text(block("hello", "x\n```text\nstale\n```"))
    figure = rf.Figure("hello", "echo run >> runs.txt; echo hello")
    assert run(repo, [figure]) == 0
    inside = f"{stamp(figure.command)}\n\n```text\nhello\n```"
    assert (repo / "README.md").read_text() == "# Title\n\n" + block("hello", inside) + "\nafter\n"
    assert (repo / "docs" / "a.md").read_text() == block("hello", inside)
    assert (repo / "runs.txt").read_text() == "run\n"


def test_server_figure_shows_the_default_url_and_the_server():
    figure = rf.Figure("ws", "tokenwire loadtest --url {ws}", serve=("--device", "cpu"))
    assert rf.render(figure, MACHINE, "out").split("\n")[0] == (
        "Measured with `tokenwire loadtest --url ws://127.0.0.1:8000/v1/ws` (against "
        "`tokenwire serve --device cpu` started by the script) on a 2-core `Test CPU 9000` "
        f"(`lscpu` model name; AVX2), {datetime.date.today().isoformat()}, commit abc1234:")


def test_serve_must_match_the_url_placeholders():
    with pytest.raises(ValueError, match="serve"):
        rf.Figure("ws", "tokenwire loadtest --url {ws}")
    with pytest.raises(ValueError, match="serve"):
        rf.Figure("ws", "echo hi", serve=("--device", "cpu"))


def test_trailing_whitespace_stripped(repo):
    (repo / "README.md").write_text(block("ws"))
    assert run(repo, [rf.Figure("ws", r"printf 'a  \nb\t\n\n\n'")]) == 0
    assert "```text\na\nb\n```\n<!-- /figure -->" in (repo / "README.md").read_text()


def test_keep_from_line():
    keep = rf.FromLine(r"^=+ Result")
    assert keep.apply(["noise", "== Result ==", "a", "=="]) == ["== Result ==", "a", "=="]
    with pytest.raises(rf.FigureFailed, match="Result"):
        keep.apply(["noise"])


def test_keep_last_lines():
    assert rf.LastLines(2).apply(["a", "b", "c"]) == ["b", "c"]
    with pytest.raises(rf.FigureFailed):
        rf.LastLines(4).apply(["a", "b", "c"])


def test_keep_rule_applied_to_the_output(repo):
    (repo / "README.md").write_text(block("cut"))
    figure = rf.Figure("cut", r"printf 'loading\nTABLE\n1\n'", keep=rf.FromLine("^TABLE"))
    assert run(repo, [figure]) == 0
    assert "```text\nTABLE\n1\n```" in (repo / "README.md").read_text()


def test_unknown_figure_name_is_an_error_naming_file_and_line(repo, capsys):
    (repo / "docs" / "a.md").write_text("intro\n\n" + block("nope"))
    assert run(repo, [rf.Figure("hello", "echo hi")]) == 2
    assert "docs/a.md:3" in capsys.readouterr().err


def test_unclosed_block_is_an_error(repo, capsys):
    (repo / "README.md").write_text("<!-- figure: hello -->\nold\n")
    assert run(repo, [rf.Figure("hello", "echo hi")]) == 2
    assert "README.md:1" in capsys.readouterr().err


def test_unknown_only_name_is_an_error(repo):
    assert run(repo, [rf.Figure("hello", "echo hi")], "--only", "nope") == 2


def test_markers_in_a_code_example_are_left_alone(repo):
    example = "```\n" + block("nope") + "```\n"
    (repo / "README.md").write_text(example + block("hello"))
    assert run(repo, [rf.Figure("hello", "echo hi")]) == 0
    assert (repo / "README.md").read_text().startswith(example)


def test_failing_command_leaves_its_blocks_and_exits_non_zero(repo):
    page = block("bad") + block("good")
    (repo / "README.md").write_text(page)
    figures = [rf.Figure("bad", "echo partial; exit 3"), rf.Figure("good", "echo fine")]
    assert run(repo, figures) == 1
    text = (repo / "README.md").read_text()
    assert text.startswith(block("bad"))
    assert "```text\nfine\n```" in text


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_empty_output_is_a_failure(repo):
    (repo / "README.md").write_text(block("quiet"))
    assert run(repo, [rf.Figure("quiet", "echo progress >&2")]) == 1
    assert (repo / "README.md").read_text() == block("quiet")


def test_only_readme_and_docs_pages_are_scanned(repo):
    (repo / "README.new.md").write_text(block("nope"))
    (repo / "docs" / "a.md").write_text(block("hello"))
    assert run(repo, [rf.Figure("hello", "echo hi")]) == 0
    assert (repo / "README.new.md").read_text() == block("nope")


def test_timeout_stops_the_command_and_what_it_started(repo):
    (repo / "README.md").write_text(block("slow"))
    started = time.monotonic()
    figure = rf.Figure("slow", "sleep 30 & echo $! > child; wait; echo late", timeout_s=1)
    assert run(repo, [figure]) == 1
    assert time.monotonic() - started < 10
    assert (repo / "README.md").read_text() == block("slow")
    child = int((repo / "child").read_text())
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child)


def test_missing_need_skips_the_figure(repo):
    (repo / "README.md").write_text(block("peer"))
    figure = rf.Figure("peer", "echo hi", needs="no-such-binary-or-module")
    assert run(repo, [figure]) == 0
    assert (repo / "README.md").read_text() == block("peer")


def test_unchanged_page_is_not_written(repo):
    (repo / "README.md").write_text(block("hello"))
    (repo / "docs" / "other.md").write_text("no blocks here\n")
    figures = [rf.Figure("hello", "echo hi")]
    assert run(repo, figures) == 0
    for page in (repo / "README.md", repo / "docs" / "other.md"):
        os.utime(page, ns=(10**18, 10**18))
    assert run(repo, figures) == 0
    assert (repo / "README.md").stat().st_mtime_ns == 10**18
    assert (repo / "docs" / "other.md").stat().st_mtime_ns == 10**18


def test_only_runs_just_the_named_figures(repo):
    (repo / "README.md").write_text(block("a") + block("b"))
    assert run(repo, [rf.Figure("a", "echo A"), rf.Figure("b", "echo B")], "--only", "b") == 0
    text = (repo / "README.md").read_text()
    assert text.startswith(block("a")) and "```text\nB\n```" in text


@pytest.mark.parametrize("flag", ["--list", "--dry-run"])
def test_list_and_dry_run_run_nothing(repo, capsys, flag):
    (repo / "docs" / "a.md").write_text("\n" + block("hello"))
    assert run(repo, [rf.Figure("hello", "touch ran; echo hi")], flag) == 0
    assert not (repo / "ran").exists()
    assert (repo / "docs" / "a.md").read_text() == "\n" + block("hello")
    out = capsys.readouterr().out
    assert "docs/a.md:2" in out and "touch ran; echo hi" in out


def test_unused_registry_figure_is_a_warning(repo, capsys):
    (repo / "README.md").write_text(block("hello"))
    figures = [rf.Figure("hello", "echo hi"), rf.Figure("spare", "touch ran; echo x")]
    assert run(repo, figures) == 0
    assert "'spare'" in capsys.readouterr().err
    assert not (repo / "ran").exists()


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_dirty_only_for_changes_outside_the_figure_pages(tmp_path):
    (tmp_path / "README.md").write_text(block("hello"))
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "start")
    (tmp_path / "README.md").write_text(block("hello", "new"))
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert blocks.checkout(tmp_path, {Path("README.md")}).isalnum()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert blocks.checkout(tmp_path, {Path("README.md")}).endswith("+dirty")


def test_the_repo_pages_name_only_registered_figures():
    """The real README.md and docs/: every block names a figure in FIGURES."""
    assert rf.main(["--dry-run"]) == 0
