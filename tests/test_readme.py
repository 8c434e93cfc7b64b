"""The README: a front page whose test command is the one CI runs. Its Python snippets run with
every page's, in tests/test_docs.py."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    test_command = [c.strip() for c in commands if "pytest" in c]
    assert len(test_command) == 1
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command[0] + " \\" in ci_lines        # continued by `|| exit 1`


def test_the_readme_stays_a_front_page():
    # The guide lives in docs/; the README says what nnkit is, how to start, and where to read on.
    assert len(README.splitlines()) <= 300, \
        "README.md is a front page: move the guide text to docs/"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README))
    guide = {page.name for page in (ROOT / "docs").glob("*.md")} - {"index.md", "contributing.md"}
    assert guide <= linked, f"README.md does not link to {sorted(guide - linked)}"


def test_the_readme_shows_the_performance_pages_benchmark_table():
    def table(text):
        return [line for line in text.splitlines() if line.startswith(("| W", "| workload"))]
    page = table((ROOT / "docs" / "performance.md").read_text())
    assert page and table(README) == page, \
        "update the benchmark table in README.md and docs/performance.md together"
