import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import ember
import ember.checkpoint
import ember.cli
import ember.data
import ember.errors
import ember.handlers
import ember.metrics
import ember.training
import ember.writers
from tests.engine import expectations as expect

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EVENTS_PAGE = (DOCS / "concepts" / "events.md").read_text()


def _block_after(marker: str) -> str:
    start = EVENTS_PAGE.index(f"<!-- expect: {marker} -->")
    return EVENTS_PAGE[start:].split("\n\n", 1)[0]


@pytest.mark.parametrize("name", ["RUN_TWO_EPOCHS", "RUN_WITHOUT_DATA", "RUN_MAX_ITERS"])
def test_event_orders_in_the_docs_match_the_tested_expectations(name):
    """Each event sequence shown in docs/concepts/events.md is the one the engine tests assert."""
    block = _block_after(name)
    lines = block.split("```text\n", 1)[1].split("```", 1)[0].split()
    assert lines == getattr(expect, name)


def test_termination_table_in_the_docs_matches_the_tested_expectations():
    """The termination table lists exactly the tested scenarios, each with its tested events."""
    start = EVENTS_PAGE.index("<!-- expect: TERMINATION -->")
    rows = re.findall(r"^\| `(.+?)` \| (.+?) \|$", EVENTS_PAGE[start:].split("\n\n", 1)[0], flags=re.M)
    table = {call: [e.strip() for e in events.split(",")] for call, events in rows}
    assert table == expect.TERMINATION


MODULES = {
    "ember": ember,
    "ember.training": ember.training,
    "ember.data": ember.data,
    "ember.metrics": ember.metrics,
    "ember.checkpoint": ember.checkpoint,
    "ember.handlers": ember.handlers,
    "ember.writers": ember.writers,
    "ember.cli": ember.cli,
    "ember.errors": ember.errors,
}
PUBLIC = [f"{mod}.{name}" for mod, m in MODULES.items() for name in m.__all__ if name != "__version__"]


def _resolve(qualified: str) -> object:
    mod, name = qualified.rsplit(".", 1)
    return getattr(MODULES[mod], name)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring_with_an_example_and_an_api_page(name):
    """Each exported name is documented: a docstring with a runnable example, and a heading in docs/api."""
    obj = _resolve(name)
    name = name.rsplit(".", 1)[1]
    doc = inspect.getdoc(obj) or ""
    assert "Examples:" in doc, f"{name} needs a docstring with an Examples section"
    assert ">>> " in doc, f"{name}'s example must be a runnable doctest"
    assert any(documented is obj for documented in _api_entries()), f"{name} needs a `::: ...` entry in docs/api/"


def _api_entries() -> list[object]:
    """The objects the API pages render (``::: ember.module.Name``), whatever path names them."""
    paths = [line[4:].strip() for p in (DOCS / "api").glob("*.md") for line in p.read_text().splitlines()]
    return [
        getattr(importlib.import_module(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1])
        for path in paths
        if path.startswith("ember.")
    ]


CLASSES = [name for name in PUBLIC if inspect.isclass(_resolve(name))]


@pytest.mark.parametrize("name", CLASSES)
def test_every_public_method_has_a_docstring(name):
    """Each public method and property of an exported class says what it does."""
    obj = _resolve(name)
    missing = [
        attr
        for attr, member in vars(obj).items()
        if not attr.startswith("_")
        and (callable(member) or isinstance(member, property | classmethod))
        and not inspect.getdoc(member)
    ]
    assert missing == []


def test_the_custom_early_stopping_on_the_handlers_page_works():
    """The from-scratch handler in docs/concepts/handlers.md stops a trainer after `patience` bad scores."""
    page = (DOCS / "concepts" / "handlers.md").read_text()
    code = page.split("<!-- run: custom-early-stopping -->\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(code, namespace)
    trainer, evaluator = ember.Engine(lambda e, b: b), ember.Engine(lambda e, b: b)
    losses = iter([0.9, 0.8, 0.85, 0.8, 0.81, 0.7])
    evaluator.add_event_handler(ember.Events.COMPLETED, lambda e: e.state.metrics.update(loss=next(losses)))
    stop = namespace["StopWhenStuck"](trainer)
    evaluator.add_event_handler(ember.Events.COMPLETED, stop)
    trainer.add_event_handler(ember.Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    assert trainer.run([0], max_epochs=10).epoch == 5
    assert stop.state_dict() == {"best": 0.8, "bad": 3}


def _claimed(code):
    """What a block says each top-level print prints: its trailing comment, or a "# prints X" line above it."""
    lines = code.splitlines()
    return [
        line.split("  # ", 1)[1] if "  # " in line else lines[i - 1].removeprefix("# prints ")
        for i, line in enumerate(lines)
        if line.startswith("print(")
    ]


def test_every_stock_handler_on_the_handlers_page_attaches_and_runs(tmp_path, monkeypatch, capsys):
    """The page's block builds each handler of its table on one trainer; the run prints what its comment says."""
    page = (DOCS / "concepts" / "handlers.md").read_text()
    first_cells = [line.split("|")[1] for line in page.splitlines() if line.startswith("| `")]
    listed = {name for cell in first_cells for name in re.findall(r"`([A-Za-z]+)`", cell)}
    assert len(listed) == 14, listed
    code = page.split("<!-- run: stock-handlers -->\n```python\n", 1)[1].split("```", 1)[0]
    assert {name for name in listed if f"{name}(" not in code} == set()  # every handler of the table is built
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    printed = capsys.readouterr().out.splitlines()[-1]
    assert [printed] == _claimed(code)


def test_the_save_handler_on_the_checkpoints_page_runs_and_prints_what_it_says(capsys):
    """The bucket saver in docs/concepts/checkpoints.md: Ignite's names, n_saved, and a restore from the dict."""
    page = (DOCS / "concepts" / "checkpoints.md").read_text()
    code = page.split("<!-- run: save-handler -->\n```python\n", 1)[1].split("```", 1)[0]
    exec(code, {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == _claimed(code) == ["['trainer_12.ckpt', 'trainer_9.ckpt']", "12"]


SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):(?:`|<code>)")


def test_the_docs_site_builds_in_strict_mode(tmp_path):
    """mkdocs-material + mkdocstrings build every page and every API entry with no warning."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=DOCS.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "handlers" / "index.html").exists()
    assert "EarlyStopping" in (tmp_path / "site" / "api" / "handlers" / "index.html").read_text()
    raw = {
        str(page.relative_to(tmp_path / "site")): sorted(set(SPHINX_ROLE.findall(page.read_text())))
        for page in (tmp_path / "site").rglob("*.html")
    }
    assert {page: roles for page, roles in raw.items() if roles} == {}  # mkdocstrings shows them as literal text
    engine_page = (tmp_path / "site" / "api" / "engine" / "index.html").read_text()
    for member in ("on", "add_event_handler", "run", "state_dict"):  # inherited from private bases, rendered
        assert f'id="ember.engine.Engine.{member}"' in engine_page
    assert 'href="#ember.engine.Engine.add_event_handler"' in engine_page  # a converted role is a link
    training_page = (tmp_path / "site" / "api" / "training" / "index.html").read_text()
    entry = training_page.split('id="ember.training.create_trainer"', 1)[1]
    signature = entry.split('class="doc-signature', 1)[1].split("</code>", 1)[0]
    # ruff (a dev dependency) formats signatures: one parameter per line, as in the source
    assert '<span class="p">(</span>\n    <span class="n">state</span>' in signature
    assert '\n    <span class="n">loss_fn</span>' in signature
    index = json.loads((tmp_path / "site" / "search" / "search_index.json").read_text())["docs"]
    titles = {entry["location"]: entry["title"] for entry in index}
    assert (titles["install/"], titles["quickstart/"]) == ("Install", "Quickstart")  # search finds them by name


def test_docstrings_cross_reference_in_markdown_not_sphinx_roles():
    """``[`Name`][ember.path.Name]`` links; a Sphinx role (``:class:`...```) would show as literal text."""
    found = [
        f"{path.relative_to(ROOT)}: {role}"
        for path in sorted((ROOT / "src" / "ember").rglob("*.py"))
        for role in SPHINX_ROLE.findall(path.read_text())
    ]
    assert found == []


def test_users_find_reliability_and_benchmarks_before_the_concepts():
    """The navigation: the first steps, then what ember survives and how fast it is, then the concepts."""
    nav = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())["nav"]
    titles = [next(iter(entry)) for entry in nav]
    assert titles[:7] == [
        "Home",
        "Install",
        "Quickstart",
        "The ember command",
        "Reliability",
        "Benchmarks",
        "Beside the alternatives",
    ]
    assert titles[7:] == ["Concepts", "Migrating", "API", "Architecture"]


def _fenced_blocks(text):
    """(language, first line number, lines) of each fenced block of a Markdown page."""
    blocks, language, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if language is None:
                language, start, lines = line.strip()[3:] or "plain", number + 1, []
            else:
                blocks.append((language, start, lines))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def test_every_example_fits_the_code_area():
    """Code, shell and config blocks keep to 88 columns (the code area at 1,400 px, and a phone's scroll).

    Blocks of program output (```` ```text ````) show what ember prints, character for character, and are left
    as printed.
    """
    too_wide = [
        f"{page.relative_to(DOCS)}:{start + i}: {len(line)} columns"
        for page in sorted(DOCS.rglob("*.md"))
        for language, start, lines in _fenced_blocks(page.read_text())
        if language != "text"
        for i, line in enumerate(lines)
        if len(line) > 88
    ]
    assert too_wide == []


def test_the_comparison_answers_each_question_for_the_same_tools_in_narrow_tables():
    """One two-column table per question (it fits a phone), each naming the same six tools in the same order."""
    page = (DOCS / "comparison.md").read_text()
    tables = re.findall(r"^## (.+)\n\n(?:(?:[^|\n].*\n)+\n)?((?:\|.*\n)+)", page, flags=re.MULTILINE)
    questions = {title: [row.split("|")[1].strip() for row in rows.splitlines()[2:]] for title, rows in tables}
    assert all(rows.splitlines()[0].count("|") == 3 for _, rows in tables)  # two columns
    tools = ["ember", "PyTorch Ignite", "Keras 3 `fit` (JAX backend)", "CLU + Orbax", "MaxText", "Levanter"]
    short = ["ember", "Ignite", "Keras", "CLU", "MaxText", "Levanter"]
    assert questions.pop("What it is") == tools
    speed = questions.pop("Speed")
    assert len(speed) == 2
    assert len(questions) == 16
    assert {title: rows for title, rows in questions.items() if rows != short} == {}
    for dormant in ("flax-extra", "jax_trainer"):  # named once, as dormant, outside the tables
        assert all(dormant not in rows for _, rows in tables)
        assert f"{dormant} (last commit" in page


def test_every_docs_page_is_in_the_site_navigation():
    """No page is orphaned: each Markdown file under docs/ is listed in mkdocs.yml's nav."""
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert [p for p in pages if p not in nav] == []


def _python_blocks(path):
    text = path.read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize(
    ("page", "index"),
    [(page, i) for page in ("README.md", "docs/index.md") for i in range(len(_python_blocks(ROOT / page)))],
)
def test_every_python_block_on_the_front_pages_runs_as_written(page, index):
    """The README's and the docs home's code blocks run as they stand, warnings as errors, in a new interpreter."""
    code = _python_blocks(ROOT / page)[index]
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if "# prints" in code:  # a block that says what it prints must print exactly that
        promised = re.search(r"# prints (.*)$", code, flags=re.MULTILINE).group(1)
        assert result.stdout.split("\n")[:-1] == re.findall(r'"([^"]*)"', promised)


def test_the_readme_names_every_example():
    """Each script in examples/ appears in the README's list of examples."""
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "examples").glob("*.py")) if f"`{p.name}`" not in readme]
    assert missing == []


def test_the_quickstart_trains_a_flax_model_and_prints_what_its_page_shows():
    """Under 30 lines of code; the printed lines are the page's, numbers within a little of them."""
    page = (DOCS / "quickstart.md").read_text()
    code = _python_blocks(DOCS / "quickstart.md")[0]
    assert len([line for line in code.splitlines() if line.strip()]) < 30
    shown = re.search(r"^```text\n(.*?)^```", page, flags=re.DOTALL | re.MULTILINE).group(1).splitlines()
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.splitlines()

    def words(line: str) -> str:
        return re.sub(r"\d+\.\d+", "x", line)

    assert [words(line) for line in printed] == [words(line) for line in shown]
    accuracy = [float(line.rsplit(maxsplit=1)[1]) for line in (printed[-1], shown[-1])]
    assert accuracy[0] == pytest.approx(accuracy[1], abs=0.03)
    assert accuracy[0] > 0.85


def test_the_figures_are_what_docs_figures_py_draws_now():
    """The checked-in SVGs are current: the event order is recorded from today's engine."""
    import runpy

    drawings = runpy.run_path(str(DOCS / "figures.py"))["DRAWINGS"]
    assert sorted(drawings) == sorted(p.name for p in (DOCS / "figures").glob("*.svg"))
    for name, draw in drawings.items():
        assert (DOCS / "figures" / name).read_text() == draw(), f"run python docs/figures.py to redraw {name}"


def _measured(pattern):
    """The numbers a regular expression finds in the benchmarks page's results (one match, every group)."""
    found = re.findall(pattern, (DOCS / "benchmarks.md").read_text(), flags=re.MULTILINE)
    assert len(found) == 1, f"the benchmarks page should hold one result for {pattern!r}, found {found}"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def _rounded(value, digits):
    return f"{float(value):.{digits}f}" if digits else str(round(float(value)))


# One number per fact: each figure a page quotes is the benchmarks page's result, as that page rounds it.
# (the fact, the benchmarks page's result, the digits each quote keeps, and the quotes: page -> pattern)
_DIGITS = r"^\| digits \| ember \| ([\d.]+) \([^|]*\| ([\d.]+) \([^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) \("
_CHARS = r"^\| chars \| ember \| ([\d.]+) \([^|]*\| ([\d.]+) \([^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) \("
_KERAS = r"ember against Keras `fit` on `digits`: ([\d.]+) \([^)]*\) for whole runs, ([\d.]+) "
_ENGINE = r"^\| engine overhead per iteration, no handlers \| ([\d.]+) \|[^|]*\| ([\d.]+) \|"
_CLI_RUN = r"^\| the digits run \(`ember train`\) \| ([\d.]+) \|"
_ORBAX = (
    r"^\| save \(to on disk, committed\) \| [^|]* \| [^|]*\(\+([\d.]+) s\)[^\n]*\n"
    r"\| restore [^|]* \| [^|]* \| [^|]*\(\+([\d.]+) s\)"
)
_H100_SAVES = (
    r"^\| training, a background save every 200 of 700 steps, host copy \| ([\d.]+) x[^\n]*\n"
    r"\| the same with `device_snapshot=True` \| ([\d.]+) x"
)
FIGURES = [
    (
        "the digits run in a warm process, s",
        _DIGITS,
        0,
        1,
        {"comparison.md": r"15 epochs, ([\d.]+) s in a warm process"},
    ),
    (
        "the digits run against the hand loop",
        _DIGITS,
        slice(1, 3),
        3,
        {
            "comparison.md": r"every handler attached \([^)]*\) \| ([\d.]+) / ([\d.]+) \|",
            "index.md": r"takes ([\d.]+) times the hand loop's speed for a whole run, ([\d.]+) for each",
        },
    ),
    ("the chars run, s", _CHARS, 0, 1, {"comparison.md": r"5 epochs, ([\d.]+) s\)"}),
    (
        "the chars run against the hand loop",
        _CHARS,
        slice(1, 3),
        3,
        {"comparison.md": r"checkpoints \([^)]*\) \| ([\d.]+) / ([\d.]+) \|"},
    ),
    (
        "ember against Keras fit",
        _KERAS,
        slice(0, 2),
        2,
        {
            "comparison.md": r"([\d.]+) times as fast as Keras 3 `fit` doing the same work \(([\d.]+) times",
            "index.md": r"([\d.]+) times as fast on the same digits run \(([\d.]+) times",
        },
    ),
    (
        "the engine against Ignite's, µs per iteration",
        _ENGINE,
        slice(0, 2),
        2,
        {
            "comparison.md": r"costs ([\d.]+) µs per iteration with no handlers, against ([\d.]+) µs for Ignite",
            "index.md": r"costing\s+([\d.]+) µs per iteration against Ignite's ([\d.]+) µs",
        },
    ),
    (
        "the digits run from launch to exit, s",
        _CLI_RUN,
        0,
        0,
        {
            "cli.md": r"validation accuracy in about (\d+) seconds from launch to exit",
            "index.md": r"98% validation accuracy in about (\d+) seconds",
            "../README.md": r"98% validation accuracy in about (\d+) seconds",
        },
    ),
    (
        "the orbax file checks, s per 512 MB",
        _ORBAX,
        slice(0, 2),
        2,
        {"concepts/checkpoints.md": r"([\d.]+) s more per 512 MB save[^)]*\) and ([\d.]+) s more"},
    ),
    (
        "background saves on the H100",
        _H100_SAVES,
        slice(0, 2),
        3,
        {"concepts/checkpoints.md": r"took ([\d.]+) x the time without saves with the host copy and ([\d.]+) x"},
    ),
]


@pytest.mark.parametrize(("fact", "source", "which", "digits", "quotes"), FIGURES, ids=[f[0] for f in FIGURES])
def test_every_page_quotes_a_measured_figure_as_the_benchmarks_page_has_it(fact, source, which, digits, quotes):
    """A figure quoted on several pages comes from one result: each quote is that result, rounded as quoted."""
    measured = _measured(source)
    expected = [_rounded(v, digits) for v in (measured[which] if isinstance(which, slice) else (measured[which],))]
    for page, pattern in quotes.items():
        quoted = re.findall(pattern, re.sub(r"\s+", " ", (DOCS / page).read_text()))
        quoted = [list(q) if isinstance(q, tuple) else [q] for q in quoted]
        assert quoted == [expected], f"{page} quotes {fact} as {quoted}; the benchmarks page measured {expected}"


def _error_examples(page: Path) -> list[tuple[str, list[str]]]:
    """The page's ``$ ember ...`` lines that print an ``ember: error:`` line, each with the lines it prints.

    A command's lines run to the next ``$`` line or the end of its text block.
    """
    examples: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```text\n(.*?)```", page.read_text(), flags=re.S):
        command: str | None = None
        shown: list[str] = []
        for line in [*block.splitlines(), "$"]:
            if line.startswith("$"):
                if command is not None and shown and shown[0].startswith("ember: error:"):
                    examples.append((command, shown))
                command, shown = line[2:] if line.startswith("$ ember ") else None, []
            elif command is not None:
                shown.append(line)
    return examples


def test_the_cli_pages_error_examples_print_what_the_commands_print(tmp_path):
    """Each mistake the CLI page shows (a config's typo, bad overrides, a model's argument) prints those lines, exit 2.

    ``bad.yaml`` is the YAML block the page shows just before its first use.
    """
    import shlex

    page = ROOT / "docs" / "cli.md"
    (bad,) = re.findall(r"With this `bad\.yaml`:\n\n```yaml\n(.*?)```", page.read_text(), flags=re.S)
    (tmp_path / "bad.yaml").write_text(bad)
    examples = _error_examples(page)
    assert [command.split()[1] for command, _ in examples] == ["train", "train", "train", "train"]
    for command, shown in examples:
        args = shlex.split(command)[1:]
        done = subprocess.run(
            [sys.executable, "-m", "ember.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert (done.returncode, done.stderr.splitlines()) == (2, shown), command
