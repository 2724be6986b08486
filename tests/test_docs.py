"""The documentation cannot go stale: the README and every page of docs/ are read here.

- the generated references (docs/reference/) are what docs/gen_reference.py makes of the code
  now, and they name every object of the spec's schema and every command;
- the site builds with ``mkdocs build --strict`` (broken links and anchors fail it);
- every full spec in a page validates, and every spec fragment validates laid over a minimal
  spec (the fragment's sections replace the minimal spec's);
- every light shell example runs (``dbspec validate``, ``plan``, ``schema``, ``jobs`` and the
  wheel build) with the exit code its comment gives, and prints the output shown below it;
- the README's links lead to files of the checkout.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, checkout_env, run_cli

PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                      if "reference" not in p.parts)
LIGHT_VERBS = ("validate", "plan", "schema", "jobs")
#: the smallest spec a fragment is laid over: what a fragment does not set comes from here
MINIMAL = {"name": "docs-fragment", "vars": {"hidden": 16},
           "data": {"source": {"kind": "sklearn", "name": "diabetes"}, "task": "regression"},
           "model": {"layers": [{"linear": {"out": "{{ hidden }}"}}, "relu",
                                {"linear": {"out": 1}}]},
           "registry": {"name": "docs_fragment"}}


def _page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(language: str) -> list[tuple[str, int, str]]:
    """(page, line, text) of every fenced block of ``language``, indented ones included."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", text, re.DOTALL | re.M):
            body = "\n".join(line[len(match.group(1)):] for line in match.group(2).splitlines())
            found.append((_page_name(page), text[:match.start()].count("\n") + 1, body))
    return found


# --------------------------------------------------------------------------- references


def test_the_reference_pages_are_what_the_generator_makes_of_the_code():
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"],
                            cwd=ROOT, env=checkout_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr + "\n(run: python docs/gen_reference.py)"


def test_the_spec_reference_has_every_object_and_field_of_the_schema():
    schema = json.loads((ROOT / "schemas" / "dbspec.schema.json").read_text())
    page = (ROOT / "docs" / "reference" / "spec.md").read_text()
    for name, definition in schema["$defs"].items():
        section = page.split(f"{{#{name.lower()}}}")
        assert len(section) == 2, f"{name} has no table in docs/reference/spec.md"
        table = section[1].split("\n### ")[0]
        for field in definition.get("properties", {}):
            assert f"| `{field}` |" in table, f"{name}.{field}"
    for field in schema["properties"]:
        assert f"| `{field}` |" in page.split("\n## ")[1], field


def test_the_cli_reference_has_every_command():
    from dbspec.cli.parser import COMMANDS

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in COMMANDS:
        assert f"\n## dbspec {command.name}\n" in page, command.name
        assert f"usage: dbspec {command.name} " in page, command.name


# --------------------------------------------------------------------------- the site


def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (in the dev extra)")
    # not -q: mkdocs counts the warnings that fail --strict only when it logs them
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**checkout_env(),
                                                         "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").exists()


def test_every_page_is_in_the_sites_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES[1:]:
        assert str(page.relative_to(ROOT / "docs")) in config, page


# --------------------------------------------------------------------------- specs


def _spec_blocks() -> list[tuple[str, int, str]]:
    sections = set(json.loads((ROOT / "schemas" / "dbspec.schema.json").read_text())
                   ["properties"])
    found = []
    for page, line, text in _blocks("yaml"):
        document = yaml.safe_load(text)
        if isinstance(document, dict) and set(document) <= sections:
            found.append((page, line, text))
    return found


def test_the_docs_hold_full_specs_and_fragments():
    full = [b for b in _spec_blocks() if {"name", "data", "model"} <= set(yaml.safe_load(b[2]))]
    assert full and len(_spec_blocks()) > len(full)


@pytest.mark.parametrize("page, line, text", [pytest.param(*b, id=f"{b[0]}:{b[1]}")
                                              for b in _spec_blocks()])
def test_every_spec_in_the_docs_validates(page, line, text, tmp_path):
    document = yaml.safe_load(text)
    if not {"name", "data", "model"} <= set(document):  # a fragment: over the minimal spec
        text = yaml.safe_dump({**MINIMAL, **document}, sort_keys=False)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = run_cli("validate", str(spec))
    assert result.returncode == 0, f"{page}:{line}: " + result.stdout + result.stderr


# --------------------------------------------------------------------------- shell examples


def _examples() -> list[tuple[str, str, str, list[str]]]:
    """(page, cwd, command, output lines shown) of every light shell example."""
    found = []
    for page, _, text in _blocks("console"):
        lines = text.splitlines()
        for index, line in enumerate(lines):
            match = re.match(r"\$ (?:cd (\S+) && )?(dbspec .*|pip wheel .*)$", line)
            if not match or not _light(match.group(2)):
                continue
            shown = []
            for after in lines[index + 1:]:
                if after.startswith(("$", "#")):
                    break
                if after.strip() and after.strip() != "...":
                    shown.append(after.strip())
            found.append((page, match.group(1) or ".", match.group(2), shown))
    return found


def _light(command: str) -> bool:
    args = shlex.split(command.split("  #")[0])
    if args[0] == "pip":
        return True
    return len(args) > 1 and args[1] in LIGHT_VERBS and "--check" not in args


def test_the_docs_have_light_examples_of_every_light_command():
    verbs = {shlex.split(c)[1] for _, _, c, _ in _examples() if c.startswith("dbspec")}
    assert verbs == set(LIGHT_VERBS)
    assert any(c.startswith("pip wheel") for _, _, c, _ in _examples())


@pytest.mark.parametrize("page, cwd, command, shown", [
    pytest.param(*e, id=f"{e[0]}: {e[2].split('  #')[0].strip()}") for e in _examples()])
def test_every_light_example_runs(page, cwd, command, shown, tmp_path):
    """An example's commands run from the checkout (``build/`` is a temp dir); ``exit 1`` in
    its comment is the exit code it must give, and the lines shown below it must be printed."""
    line, _, comment = command.partition("  #")
    args = [a.replace("build/", f"{tmp_path}/") for a in shlex.split(line)]
    folder = ROOT / cwd
    args = list(_expand(args, folder))
    if args[0] == "pip":
        result = _build_wheel(args, tmp_path)
    else:
        result = run_cli(*args[1:], cwd=folder, env={"DBSPEC_TEST_SURELY_UNSET": ""})
    expected = 1 if "exit 1" in comment else 0
    output = result.stdout + result.stderr
    assert result.returncode == expected, f"{page}: {command}\n{output[-3000:]}"
    for text in shown:
        assert text in output, f"{page}: {command}: not printed: {text}\n{output[-3000:]}"


def _expand(args: list[str], folder: Path):
    for arg in args:
        if "*" in arg:
            yield from (str(p.relative_to(folder)) for p in sorted(folder.glob(arg)))
        else:
            yield arg


def _build_wheel(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The wheel step, on a copy of the checkout's package (as a fresh clone has it)."""
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copytree(ROOT / "dbspec", clone / "dbspec",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, clone / name)
    result = subprocess.run([sys.executable, "-m", *args], cwd=clone, capture_output=True,
                            text=True, timeout=300)
    wheels = list((clone / args[args.index("-w") + 1]).glob("dbspec-*.whl"))  # relative: in it
    assert wheels or result.returncode != 0, result.stdout + result.stderr
    return result


def test_the_readmes_links_lead_to_files_of_the_checkout():
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link
