"""mkdocs hook: the examples gallery page (``gallery.md``), generated from ``examples/``.

For each numbered script: its docstring (the story), the command and what it printed and the
figures it drew (recorded by ``tools/gallery.py`` in ``docs/gallery/<name>/``), and its source.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "gallery.md"


def _section(script: Path) -> str:
    source = script.read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    title, _, story = doc.partition("\n")
    recorded = ROOT / "docs" / "gallery" / script.stem
    output = recorded / "output.txt"
    title = title.split(":", 1)[1].strip() if title[:2].isdigit() and ":" in title else title
    heading = f"## {script.stem}: {title.rstrip('.')} {{ #{script.stem} }}"
    parts = [heading, story.strip().replace("``", "`")]
    if output.exists():
        parts.append(f"```text\n{output.read_text().rstrip()}\n```")
    else:
        parts.append("*No recorded output: run `python tools/gallery.py " + script.stem + "`.*")
    for figure in sorted(recorded.glob("*.png")):
        parts.append(f"![{figure.stem}](gallery/{script.stem}/{figure.name})")
    parts.append(
        f'??? example "Source: examples/{script.name}"\n\n'
        + "    ```python\n"
        + "".join(f"    {line}" if line.strip() else "\n" for line in source.splitlines(True))
        + "\n    ```"
    )
    return "\n\n".join(parts)


def page() -> str:
    scripts = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
    head = (
        "# Examples gallery\n\n"
        "The numbered scripts of `examples/`, each with what it printed and drew when run "
        "(`python examples/NN_name.py`; the main example with its full settings, the others "
        "with `--small`, as the test suite runs them). An installed package has them too: "
        "`difffn demo` runs the first."
    )
    return "\n\n".join([head, *(_section(s) for s in scripts)]) + "\n"


def on_files(files: Files, config: object, **kwargs: object) -> Files:
    files.append(File.generated(config, PAGE, content=page()))  # type: ignore[arg-type]
    return files
