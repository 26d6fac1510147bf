"""Users have the repository, not the team's internal documents: no docstring, doc or example may
send them to a style guide, a design document or a shared folder they do not have."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = re.compile(r"STYLE ?(\.md|item|\d)|DESIGN ?(\.md|principle)|\.\./shared/")


def test_nothing_cites_documents_users_do_not_have() -> None:
    cited = []
    for folder, pattern in (("src", "*.py"), ("docs", "*.md"), ("examples", "*"), ("tools", "*")):
        for path in sorted((ROOT / folder).rglob(pattern)):
            if not path.is_file() or path.suffix in {".png", ".onnx", ".safetensors", ".pt2", ".json"}:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if INTERNAL.search(line):
                    cited.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    readme = (ROOT / "README.md").read_text()
    cited += [f"README.md: {m.group(0)}" for m in INTERNAL.finditer(readme)]
    assert not cited, "internal documents cited:\n" + "\n".join(cited)
