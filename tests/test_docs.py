"""The README and docs/ point at things that exist.

Every relative link in ``README.md`` and ``docs/*.md`` must resolve to a file or folder of the
repository, and a ``#fragment`` into a Markdown file to one of its headings (GitHub's anchors).
Every command in their shell blocks must exist: ``make`` targets in the Makefile,
``llm-serving`` subcommands and options in the typer app that ``pyproject.toml`` installs under
that name, ``python -m`` modules on the path, and the repository files the commands read (a
file an earlier command writes, with ``>`` or ``--out``, counts). Other programs (``pulumi``,
``docker``) are not checked.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))

FENCE = re.compile(r"^(```|~~~)(.*?)$(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
SHELL_INFO = {"sh", "bash", "shell", "console", "zsh"}
MAKE_RULE = re.compile(r"^([A-Za-z0-9_.%/-]+(?:[ \t]+[A-Za-z0-9_.%/-]+)*)[ \t]*::?(?!=)", re.M)
PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
PATH_LIKE = re.compile(r"/|\.(?:ya?ml|py|toml|txt|md|json|cfg|ini|sh)$")
# Options whose value a command writes rather than reads: it need not exist beforehand.
OUTPUT_OPTIONS = {"--out", "--json", "-o", "--output", ">", ">>"}


def _without_code(markdown: str) -> str:
    """The text outside fenced blocks and code spans, where links and headings are real."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, repeats numbered ``-1``, ``-2``, ... as GitHub does."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_problems(doc: Path, repo: Path = REPO) -> list[str]:
    """One line per relative link of ``doc`` that does not resolve."""
    text = doc.read_text(encoding="utf-8")
    problems = []
    for match in LINK.finditer(_without_code(text)):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto: ...: not a file of this repository
        path_part, _, fragment = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        where = f"{doc.relative_to(repo)}: link {target!r}"
        if not path.exists():
            problems.append(f"{where}: {path_part} does not exist")
        elif repo.resolve() not in path.parents and path != repo.resolve():
            problems.append(f"{where}: points outside the repository")
        elif (
            fragment
            and path.suffix == ".md"
            and fragment not in anchors(path.read_text(encoding="utf-8"))
        ):
            problems.append(f"{where}: no heading #{fragment} in {path_part or doc.name}")
    return problems


def shell_commands(markdown: str) -> Iterator[list[str]]:
    """The commands of the shell blocks, split into words, comments and prompts removed."""
    for match in FENCE.finditer(markdown):
        if match.group(2).strip().split(" ")[0] not in SHELL_INFO:
            continue
        logical = re.sub(r"\\\n", " ", match.group(3))
        for line in logical.splitlines():
            words = shlex.split(line.removeprefix("$ "), comments=True)
            command: list[str] = []
            for word in [*words, ";"]:
                if word in {"&&", "||", ";", "|"}:
                    if command:
                        yield command
                    command = []
                else:
                    command.append(word)


def make_targets(makefile: Path) -> set[str]:
    """Every explicit target of the Makefile (variable and pattern targets left out)."""
    targets: set[str] = set()
    for match in MAKE_RULE.finditer(makefile.read_text(encoding="utf-8")):
        targets.update(t for t in match.group(1).split() if "%" not in t)
    return targets


def cli_command(repo: Path = REPO, script: str = "llm-serving") -> Any:
    """The click command behind the console script ``script`` of ``pyproject.toml`` (typed
    ``Any``: typer builds it from the click it vendors, whose classes it does not export)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    module, _, attribute = project["project"]["scripts"][script].partition(":")
    app = getattr(importlib.import_module(module), attribute)
    return typer.main.get_command(app) if isinstance(app, typer.Typer) else app


def _cli_problems(words: list[str], command: Any) -> list[str]:
    """What of ``llm-serving <words>`` the app does not have: a subcommand or an option."""
    problems = []
    path = ["llm-serving"]
    for word in words:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            if option not in known | {"--help"}:
                problems.append(f"{' '.join(path)} has no option {option}")
        elif hasattr(command, "commands"):  # a group: the word names its subcommand
            sub = command.commands.get(word)
            if sub is None:
                problems.append(f"{' '.join(path)} has no command {word!r}")
                break
            command = sub
            path.append(word)
    return problems


def _path_problems(words: list[str], repo: Path, written: set[str]) -> list[str]:
    """Repository paths that ``words`` read and that do not exist; adds what they write to
    ``written``, so that a later command may read it."""
    problems = []
    for before, word in zip(["", *words], words, strict=False):
        if before in OUTPUT_OPTIONS:
            written.add(word)
        if word in written or word.startswith("-") or not PATH_LIKE.search(word):
            continue
        if any(c in word for c in "<>$*{}") or "://" in word or word.startswith(("/", "~")):
            continue  # a placeholder, a variable, a URL or a path outside the repository
        if not (repo / word).exists():
            problems.append(f"{word} does not exist")
    return problems


def _module(name: str) -> bool:
    """Whether ``python -m name`` finds the module (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def command_problems(doc: Path, repo: Path = REPO, cli: Any = None) -> list[str]:
    """One line per command of ``doc``'s shell blocks that names something missing
    (``cli``: the ``llm-serving`` command, by default the one ``pyproject.toml`` installs)."""
    targets = make_targets(repo / "Makefile")
    cli = cli_command(repo) if cli is None else cli
    problems = []
    written: set[str] = set()
    for words in shell_commands(doc.read_text(encoding="utf-8")):
        program, args = words[0], words[1:]
        found: list[str] = []
        if program == "make":
            wanted = [a for a in args if "=" not in a and not a.startswith("-")]
            found += [f"make has no target {t!r}" for t in wanted if t not in targets]
        elif program == "llm-serving":
            found += _cli_problems(args, cli)
        elif PYTHON.match(program) and args[:1] == ["-m"] and len(args) > 1:
            found += [f"no module {m} to run with python -m" for m in args[1:2] if not _module(m)]
        found += _path_problems(args, repo, written)
        problems += [f"{doc.name}: `{shlex.join(words)}`: {p}" for p in found]
    return problems


@pytest.mark.parametrize("doc", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    assert link_problems(doc) == []


@pytest.mark.parametrize("doc", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_command_shown_exists(doc: Path) -> None:
    assert command_problems(doc) == []


def test_the_readme_shows_both_commands_first() -> None:
    first = next(shell_commands((REPO / "README.md").read_text(encoding="utf-8")))
    assert first == ["make", "plan", "STACK=prod-us-east-1"]


def _toy_cli() -> typer.Typer:
    """An ``llm-serving`` with ``package build`` and ``publish --bucket``, for the checker."""
    app = typer.Typer()
    package = typer.Typer()
    app.add_typer(package, name="package")

    @app.callback()
    def root() -> None:
        """Groups of one command stay groups (typer collapses them otherwise)."""

    @package.callback()
    def packages() -> None:
        """Build packages."""

    @package.command("build")
    def build(src: str) -> None:
        """Build."""

    @app.command("publish")
    def publish(out: str, bucket: str = typer.Option(...)) -> None:
        """Publish."""

    return app


def test_the_checker_reports_broken_links_and_missing_commands(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text("test: lint\n\t@true\nVENV := .venv\n")
    (tmp_path / "there.md").write_text("# A heading\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "See [the guide](missing.md), [a heading](there.md#a-heading),\n"
        "[no such heading](there.md#nothing) and `[in code](ignored.md)`.\n\n"
        "```sh\n"
        "make test            # exists\n"
        "make deploy-everything STACK=x\n"
        "llm-serving package frobnicate OUT\n"
        "llm-serving publish OUT --bucket B --no-such-flag\n"
        "python -m no_such_module_here --help\n"
        "cat images/missing.toml\n"
        "```\n"
    )
    links = link_problems(readme, repo=tmp_path)
    commands = command_problems(readme, repo=tmp_path, cli=typer.main.get_command(_toy_cli()))
    assert links == [
        "README.md: link 'missing.md': missing.md does not exist",
        "README.md: link 'there.md#nothing': no heading #nothing in there.md",
    ]
    assert commands == [
        "README.md: `make deploy-everything STACK=x`: make has no target 'deploy-everything'",
        "README.md: `llm-serving package frobnicate OUT`: "
        "llm-serving package has no command 'frobnicate'",
        "README.md: `llm-serving publish OUT --bucket B --no-such-flag`: "
        "llm-serving publish has no option --no-such-flag",
        "README.md: `python -m no_such_module_here --help`: "
        "no module no_such_module_here to run with python -m",
        "README.md: `cat images/missing.toml`: images/missing.toml does not exist",
    ]


def test_anchors_follow_githubs_rules() -> None:
    text = "# `/v1/score` and the `x_y` backend\n## Start-up\n## Start-up\n```sh\n# not one\n```\n"
    assert anchors(text) == {"v1score-and-the-x_y-backend", "start-up", "start-up-1"}


def _deploy_block(doc: Path) -> str:
    """The shell block of ``doc`` that logs in to the state backend: its real-deploy commands."""
    for match in FENCE.finditer(doc.read_text(encoding="utf-8")):
        if match.group(2).strip() in SHELL_INFO and "pulumi login" in match.group(3):
            return match.group(0)
    raise AssertionError(f"{doc.name}: no shell block with `pulumi login`")


def _stack_of(args: list[str]) -> str | None:
    for before, word in zip(["", *args], args, strict=False):
        if before in {"-s", "--stack"}:
            return word
        if word.startswith("--stack="):
            return word.removeprefix("--stack=")
    return None


@pytest.mark.parametrize(
    "doc", [REPO / "README.md", REPO / "docs" / "stacks.md"], ids=lambda p: p.name
)
def test_the_deploy_steps_create_each_stack_with_a_secrets_provider_first(doc: Path) -> None:
    # With the S3 backend a stack must exist (`pulumi stack init`) before `pulumi up`, and one made
    # without --secrets-provider gets the passphrase provider: CI, which sets no passphrase of its
    # own choosing, then stops at "getting secrets manager: passphrase must be set".
    created: set[str] = set()
    ups = 0
    for words in shell_commands(_deploy_block(doc)):
        if words[:3] == ["pulumi", "stack", "init"]:
            args = words[3:]
            assert any(a.split("=", 1)[0] == "--secrets-provider" for a in args), words
            valued = {"-s", "--stack", "--secrets-provider", "--copy-config-from"}
            positional = [
                a
                for before, a in zip(["", *args], args, strict=False)
                if not a.startswith("-") and before not in valued
            ]
            created.add(_stack_of(args) or positional[0])
        elif words[:2] == ["pulumi", "up"]:
            ups += 1
            stack = _stack_of(words[2:])
            assert stack in created, f"{doc.name}: `pulumi up -s {stack}` before its stack init"
    assert ups, f"{doc.name}: the deploy block runs no `pulumi up`"
