"""README.md and docs/*.md as a reader uses them: every relative link and anchor resolves, every command of their
```sh blocks exists, and the settings table names every setting.

A command exists when its program is a file of the repository, a console script of pyproject.toml, a module
(`python3 -m`), a program on PATH, or one of the tools a reader runs against a cluster or a registry (READER_TOOLS,
which this machine need not have). A `model-placement` command is asked of the command line itself: its subcommand
and every flag must appear in `model-placement SUBCOMMAND --help`, run in this process through the console script's
entry point as pyproject.toml names it (so it follows the code wherever the command line lives). A Python script's
flags must be string literals of the script or of a repository module it imports. Nothing else is executed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import shutil
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
READER_TOOLS = {"kubectl", "helm", "docker", "podman", "curl"}
SHELL_WORDS = {"cd", "export", "set", "echo", "true", "test", "for", "do", "done", "if", "then", "else", "fi"}
SCRIPT = "model-placement"

FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)[^\n]*\n(.*?)^\1\s*$", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where a link is a link."""
    text = FENCE.sub("", text)
    return re.sub(r"(`+).+?\1", "", text, flags=re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text stays
    text = text.replace("`", "").lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def broken_links(path: Path, root: Path = ROOT) -> Iterator[str]:
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: link {target}"
        if not dest.exists():
            yield f"{where}: {file_part} does not exist"
        elif not dest.is_relative_to(root):
            yield f"{where}: points outside the repository"
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            yield f"{where}: {dest.relative_to(root)} has no heading with anchor #{anchor}"


# -- commands --------------------------------------------------------------------------------------------------

def sh_blocks(path: Path) -> Iterator[str]:
    for match in FENCE.finditer(path.read_text()):
        if match.group(2) in ("sh", "bash", "shell", "console"):
            yield match.group(3)


def simple_commands(block: str) -> Iterator[list[str]]:
    """Each simple command of a block: continuations joined, comments dropped, split at | || && ; and newlines."""
    text = block.replace("\\\n", " ")
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in lexer:
            if token and set(token) <= set("|&;()<>"):
                if words:
                    yield words
                words = []
                if token in (">", ">>", "<", "2>"):
                    lexer.get_token()  # a redirection's file is no command
            else:
                words.append(token)
        if words:
            yield words


@cache
def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@cache
def console_scripts() -> dict[str, str]:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    return dict(project.get("scripts", {}))


@cache
def help_text(*argv: str) -> tuple[int, str]:
    """`model-placement ARGV --help` in this process, through the console script's entry point."""
    module, _, function = console_scripts()[SCRIPT].partition(":")
    main = getattr(importlib.import_module(module), function)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*argv, "--help"])
        except SystemExit as exc:  # argparse's --help
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue() + err.getvalue()


def flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if re.match(r"^--?[A-Za-z][\w-]*", w)]


def check_model_placement(words: list[str]) -> Iterator[str]:
    code, top = help_text()
    assert code == 0, top
    # The subcommands: the names the top-level help lists in its command section.
    commands = set(re.findall(r"^ {4}([a-z][a-z-]*)\s", top, re.M))
    assert {"render", "report"} <= commands, top
    sub = next((w for w in words[1:] if not w.startswith("-") and w in commands), None)
    if sub is None:
        yield f"no subcommand of {SCRIPT} ({', '.join(sorted(commands))})"
        return
    code, text = help_text(sub)
    if code != 0:
        yield f"`{SCRIPT} {sub} --help` exits {code}"
        return
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))
    for flag in flags(words):
        if flag not in known and flag not in ("-h", "--help"):
            yield f"{SCRIPT} {sub} has no flag {flag}"


def repo_file(word: str) -> Path | None:
    path = (ROOT / word).resolve()
    return path if path.is_relative_to(ROOT) and path.is_file() else None


@cache
def literals(path: Path) -> frozenset[str]:
    """String constants of a Python file and of the repository modules it imports."""
    tree = ast.parse(path.read_text())
    out = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        for name in names:
            for candidate in (ROOT / (name.replace(".", "/") + ".py"), path.parent / (name.split(".")[-1] + ".py")):
                if candidate.is_file() and candidate != path:
                    out |= {n.value for n in ast.walk(ast.parse(candidate.read_text()))
                            if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return frozenset(out)


def check_python(words: list[str]) -> Iterator[str]:
    rest = words[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        module = rest[1]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            yield f"no module {module}"
        return
    script = next((w for w in rest if not w.startswith("-")), None)
    if script is None:
        return
    path = repo_file(script)
    if path is None:
        yield f"no file {script} in the repository"
        return
    known = literals(path)
    for flag in flags(rest[rest.index(script) + 1:]):
        if flag not in known and flag not in ("-h", "--help"):
            yield f"{script} has no flag {flag}"


def problems(words: list[str]) -> Iterator[str]:
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return
    program = words[0]
    if program == SCRIPT:
        yield from check_model_placement(words)
    elif re.fullmatch(r"python3?(\.\d+)?", program):
        yield from check_python(words)
    elif program in ("bash", "sh") and len(words) > 1 and not words[1].startswith("-"):
        if repo_file(words[1]) is None:
            yield f"no file {words[1]} in the repository"
    elif "/" in program:
        if repo_file(program) is None:
            yield f"no file {program} in the repository"
    elif not (program in SHELL_WORDS or program in READER_TOOLS or program in console_scripts()
              or shutil.which(program)):
        yield f"no program {program} (not in the repository, pyproject.toml's scripts or PATH)"


# -- the tests -------------------------------------------------------------------------------------------------

def test_every_relative_link_and_anchor_resolves() -> None:
    broken = [problem for path in DOCS for problem in broken_links(path)]
    assert not broken, "\n".join(broken)


def test_every_documented_command_exists() -> None:
    found = []
    checked = 0
    for path in DOCS:
        for block in sh_blocks(path):
            for words in simple_commands(block):
                checked += 1
                found += [f"{path.relative_to(ROOT)}: `{shlex.join(words)}`: {p}" for p in problems(words)]
    assert checked > 50, checked  # the blocks were read
    assert not found, "\n".join(found)


def test_every_setting_is_in_the_configuration_table() -> None:
    from placement.config import KubeletGroup, Settings

    text = (ROOT / "docs" / "configuration.md").read_text()
    keys = text[text.index("## Every key"):text.index("## Which nodes")]
    group = text[text.index("## Node groups"):]
    assert {line.split("`")[1] for line in keys.splitlines() if line.startswith("| `")} == set(Settings.model_fields)
    assert {line.split("`")[1] for line in group.splitlines() if line.startswith("| `")} == set(
        KubeletGroup.model_fields)


def test_docs_stay_inside_the_repository() -> None:
    for path in [*DOCS, *ROOT.glob("manifests/**/*.yaml")]:
        text = path.read_text()
        assert "../shared" not in text and "DESIGN.md" not in text, path


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """A broken link, a missing anchor, a missing script, an unknown subcommand and an unknown flag are named."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[gone](nowhere.md) [self](#a-page) [bad](#no-such) `[code](ignored.md)`\n")
    assert [p.split(": ", 2)[2] for p in broken_links(page, tmp_path)] == [
        "nowhere.md does not exist", "page.md has no heading with anchor #no-such"]
    block = ("model-placement render examples/kserve-tp1-pod.yaml -o json | head\n"
             "model-placement renders FILE\nmodel-placement report --bogus\n"
             "python3 bench/no_such_bench.py\npython3 bench/bench_oracle.py --scenarios 5 --bogus\n"
             "python3 -m no_such_module\nkubectl get pods  # a reader's tool\nno-such-program-here --x\n")
    said = [p for words in simple_commands(block) for p in problems(words)]
    assert said[0].startswith("no subcommand of model-placement (balloons-policy, certs, explain, "), said
    assert said[1:] == ["model-placement report has no flag --bogus",
                    "no file bench/no_such_bench.py in the repository", "bench/bench_oracle.py has no flag --bogus",
                    "no module no_such_module",
                    "no program no-such-program-here (not in the repository, pyproject.toml's scripts or PATH)"]



def test_every_metric_is_in_operations() -> None:
    """Each metric the servers register, wherever they register it, is in docs/operations.md (written in full or as
    `…_<rest>`)."""
    tool = pyproject()["tool"]
    assert isinstance(tool, dict)
    packages = [d for pattern in tool["setuptools"]["packages"]["find"]["include"] for d in ROOT.glob(pattern)]
    metric = re.compile(r"(?:Counter|Gauge|Histogram|Summary)\(\s*\"model_placement_(\w+)\"")
    names = {m for d in packages for p in d.rglob("*.py") for m in metric.findall(p.read_text())}
    assert len(names) > 10, names
    text = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(n for n in names if not re.search(rf"(model_placement|…)_{n}\b", text))
    assert not missing, f"metrics not in docs/operations.md: {', '.join(missing)}"
