"""The README and the docs site say only what exists: links resolve, anchors exist, fields are real.

Anchors are checked with MkDocs' slug rule (the site), and every heading must get the same anchor
under GitHub's rule too, so a link works on the site and on GitHub alike. Field paths written in
backticks (`spec.limits.maxIterations`, `status.usage.costUSD`) must exist in the generated CRD.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api.crd import agent_crd, crd, quota_crd, schedule_crd, template_crd
from agentrun.api.reference import reference_markdown
from agentrun.cli.main import main
from agentrun.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference" / "agentrun.md"
#: Links to files outside docs/ are written as GitHub URLs (MkDocs cannot serve them); they name
#: files of this repository, so they are checked against the tree like relative links.
REPO_URL = re.compile(r"^https://github\.com/agentrun-dev/agentrun-operator/(?:blob|tree)/main/")

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_FIELD_PATH = re.compile(r"(?<![\w/-])(spec|status)((?:\.[A-Za-z_]\w*|\[[^\]\s]*\])+)")


@dataclass(frozen=True)
class Problem:
    file: str
    text: str

    def __str__(self) -> str:
        return f"{self.file}: {self.text}"


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def prose_lines(text: str) -> Iterator[str]:
    """Lines outside fenced code blocks and HTML comments: a `# comment` in a shell block is no heading."""
    fence = False
    for line in re.sub(r"<!--.*?-->", "", text, flags=re.S).splitlines():
        if _FENCE.match(line.lstrip()):
            fence = not fence
            continue
        if not fence:
            yield line


def _heading_text(raw: str) -> str:
    text = re.sub(r"\{#[^}]*\}\s*$", "", raw)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"<[^>]+>", "", text).replace("`", "").strip()


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc slugify, which MkDocs uses for heading ids."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    return [_heading_text(m.group(2)) for line in prose_lines(text) if (m := _HEADING.match(line))]


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    for line in prose_lines(text):
        if m := _HEADING.match(line):
            explicit = re.search(r"\{#([^}\s]+)\}\s*$", m.group(2))
            slug = explicit.group(1) if explicit else mkdocs_slug(_heading_text(m.group(2)))
            unique, n = slug, 0
            while unique in found:
                n += 1
                unique = f"{slug}_{n}"
            found.add(unique)
    return found


def links(text: str) -> Iterator[str]:
    for line in prose_lines(text):
        line = _CODE_SPAN.sub("", line)
        yield from (m.group(1) for m in _LINK.finditer(line))
        if m := _REF_DEF.match(line):
            yield m.group(1)


def link_problems(root: Path, files: list[Path]) -> list[Problem]:
    problems: list[Problem] = []
    for file in files:
        name = str(file.relative_to(root))
        for target in links(file.read_text()):
            if REPO_URL.match(target):
                path_part, _, fragment = REPO_URL.sub("", target).partition("#")
                resolved = root / path_part
            elif re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # another site: not ours to check offline
            else:
                path_part, _, fragment = target.partition("#")
                resolved = (file.parent / path_part).resolve() if path_part else file
                inside_docs = resolved.is_relative_to((root / "docs").resolve())
                if file.is_relative_to(root / "docs") and path_part and not inside_docs:
                    problems.append(Problem(name, f"{target}: outside docs/, link the GitHub URL instead"))
                    continue
            if not resolved.exists():
                problems.append(Problem(name, f"{target}: no such file"))
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text()):
                problems.append(Problem(name, f"{target}: no heading with anchor #{fragment}"))
    return problems


def _schemas() -> list[dict[str, Any]]:
    """The kinds the docs write about (AgentRun, AgentRunQuota, Agent, AgentSchedule, SandboxTemplate): a
    field path is real in any."""
    return [
        definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for definition in (crd(), quota_crd(), agent_crd(), schedule_crd(), template_crd())
    ]


def field_exists(path: str, schema: dict[str, Any]) -> bool:
    node = schema
    for part in re.findall(r"\.(\w+)|\[[^\]]*\]", f".{path}"):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return True  # free-form (a built-in's config, an input schema): any key may follow
        if part == "":
            if not isinstance(node.get("items"), dict):
                return False
            node = node["items"]
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            return False
    return True


def field_problems(root: Path, files: list[Path]) -> list[Problem]:
    schemas = _schemas()
    return [
        Problem(str(file.relative_to(root)), f"`{m.group(0)}` is not a field")
        for file in files
        for line in prose_lines(file.read_text())
        for span in _CODE_SPAN.finditer(line)
        for m in _FIELD_PATH.finditer(span.group(2))
        if not any(field_exists(m.group(0), schema) for schema in schemas)
    ]


def test_every_link_and_anchor_in_the_readme_and_the_docs_resolves() -> None:
    problems = link_problems(ROOT, markdown_files())
    assert not problems, "broken links:\n" + "\n".join(map(str, problems))


def test_every_spec_and_status_field_the_docs_name_exists_in_the_crd() -> None:
    problems = field_problems(ROOT, markdown_files())
    assert not problems, "fields the CRD does not have:\n" + "\n".join(map(str, problems))


def test_every_repository_path_the_docs_name_exists() -> None:
    top = "|".join(re.escape(p.name) for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))
    path = re.compile(rf"^(?:{top})/[\w./-]*$")
    missing = [
        f"{file.relative_to(ROOT)}: `{span.group(2)}` does not exist"
        for file in markdown_files()
        for line in prose_lines(file.read_text())
        for span in _CODE_SPAN.finditer(line)
        if path.match(span.group(2)) and not (ROOT / span.group(2)).exists()
    ]
    assert not missing, "\n".join(missing)


def test_every_operator_setting_has_a_row_in_the_settings_table() -> None:
    """docs/operating.md ('Operator settings') documents every AGENTRUN_* variable the operator reads;
    the API key and base URL have rows of their own, as ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL."""
    page = (DOCS / "operating.md").read_text()
    rows = set(re.findall(r"^\| `(AGENTRUN_[A-Z0-9_]+)` \|", page, flags=re.MULTILINE))
    read = set(Settings.environment_variables()) - {
        "AGENTRUN_ANTHROPIC_API_KEY",
        "AGENTRUN_ANTHROPIC_BASE_URL",
    }
    assert sorted(read - rows) == []


def test_every_heading_has_the_same_anchor_on_github_and_on_the_docs_site() -> None:
    differing = [
        f"{file.relative_to(ROOT)}: {text!r} is #{mkdocs_slug(text)} on the site, #{github_slug(text)}"
        " on GitHub"
        for file in markdown_files()
        for text in headings(file.read_text())
        if mkdocs_slug(text) != github_slug(text)
    ]
    assert not differing, "\n".join(differing)


def test_committed_field_reference_equals_generated_output() -> None:
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/reference/agentrun.md is stale: run `make docs` (or `make crds`)"
    )


def test_agentrun_crd_reference_prints_the_page_make_docs_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--reference"]) == 0
    assert capsys.readouterr().out == REFERENCE.read_text()


@pytest.mark.parametrize(
    ("page", "definition"),
    [
        ("agentrun.md", crd),
        ("agentrunquota.md", quota_crd),
        ("agent.md", agent_crd),
        ("agentschedule.md", schedule_crd),
        ("sandboxtemplate.md", template_crd),
    ],
)
def test_field_reference_has_a_row_for_every_field_of_the_crd(
    page: str, definition: Callable[[], dict[str, Any]]
) -> None:
    def objects(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        yield path, node
        for name, prop in node.get("properties", {}).items():
            items = prop.get("items")
            child, sub = (f"{path}.{name}[]", items) if isinstance(items, dict) else (f"{path}.{name}", prop)
            if "properties" in sub:
                yield from objects(sub, child)

    sections = re.split(r"^#+ ", (DOCS / "reference" / page).read_text(), flags=re.M)
    bodies = {section.split("\n", 1)[0].strip("`"): section for section in sections}
    schema = definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for top in [t for t in ("spec", "status") if t in schema["properties"]]:  # a template has no status
        for path, node in objects(schema["properties"][top], top):
            assert path in bodies, f"the reference has no section for {path}"
            for name in node["properties"]:
                assert f"| `{name}` |" in bodies[path], f"the reference has no row for {path}.{name}"


def test_every_docs_page_is_in_the_site_navigation_and_every_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def entries(nav: Any) -> Iterator[str]:
        if isinstance(nav, str):
            yield nav
        elif isinstance(nav, list):
            for item in nav:
                yield from entries(item)
        elif isinstance(nav, dict):
            for value in nav.values():
                yield from entries(value)

    listed = {e for e in entries(config["nav"]) if not REPO_URL.match(e) and "://" not in e}
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(pages - listed) == [], "pages missing from mkdocs.yml nav"
    assert sorted(listed - pages) == [], "nav entries without a page"


def test_readme_stays_short_and_starts_with_install() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move reference material to docs/"
    helm = next(i for i, line in enumerate(lines) if line.startswith("helm install"))
    assert helm < 50, f"`helm install` is on line {helm + 1}; it belongs on the first screen"


# The checkers above must be able to fail: each is shown a small tree with one mistake.


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Title\n\nSee [tools](docs/tools.md#built-in-tools).\n")
    (tmp_path / "docs" / "tools.md").write_text(
        "# Tools\n\n## Built-in tools\n\n```sh\n# not a heading\n```\n"
    )
    return tmp_path


def test_link_checker_accepts_a_tree_whose_links_resolve(tree: Path) -> None:
    assert link_problems(tree, markdown_files(tree)) == []


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        ("[x](docs/tool.md)", "docs/tool.md: no such file"),
        ("[x](docs/tools.md#builtin-tools)", "no heading with anchor #builtin-tools"),
        ("[x](#title-two)", "#title-two: no heading with anchor #title-two"),
        ("[x](docs/tools.md#not-a-heading)", "docs/tools.md#not-a-heading: no heading with anchor"),
        (
            "[x](https://github.com/agentrun-dev/agentrun-operator/blob/main/examples/none.yaml)",
            "examples/none.yaml: no such file",
        ),
    ],
)
def test_link_checker_reports_a_missing_file_or_anchor(tree: Path, readme: str, expected: str) -> None:
    (tree / "README.md").write_text(f"# Title\n\n{readme}\n")
    problems = [str(p) for p in link_problems(tree, markdown_files(tree))]
    assert len(problems) == 1 and expected in problems[0], problems


def test_link_checker_refuses_a_docs_page_linking_out_of_docs(tree: Path) -> None:
    (tree / "docs" / "tools.md").write_text("# Tools\n\n## Built-in tools\n\n[readme](../README.md)\n")
    problems = [str(p) for p in link_problems(tree, markdown_files(tree))]
    assert problems == ["docs/tools.md: ../README.md: outside docs/, link the GitHub URL instead"]


def test_field_checker_reports_a_field_the_crd_does_not_have(tree: Path) -> None:
    (tree / "docs" / "tools.md").write_text(
        "# Tools\n\n`spec.limits.maxIterations`, `spec.tools[0].builtin.config.namespaces`, "
        "`kubectl explain agentrun.spec.limits`, `status.usage.costUSD`, `spec.limits.maxIteration`\n"
    )
    problems = [str(p) for p in field_problems(tree, markdown_files(tree))]
    assert problems == ["docs/tools.md: `spec.limits.maxIteration` is not a field"]


def test_slug_rules_agree_on_plain_headings_and_differ_on_symbols() -> None:
    assert mkdocs_slug("Cancel, delete, TTL") == github_slug("Cancel, delete, TTL") == "cancel-delete-ttl"
    assert mkdocs_slug("Stop reasons & retries") != github_slug("Stop reasons & retries")
