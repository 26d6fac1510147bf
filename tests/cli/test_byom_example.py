"""examples/byom: the config docs/models.md serves loads, and names the family the script's variants
are added to (the script itself runs in tests/runtime/test_byom_failover.py's fixture, through the
same functions)."""

from __future__ import annotations

import ast
from pathlib import Path

from failsoft.runtime.config import load_config
from failsoft.zoo import resolve_repository

BYOM = Path(__file__).resolve().parents[2] / "examples" / "byom"


def test_the_byom_config_serves_family_img_from_the_hf_variant():
    config = load_config(BYOM / "serve.yaml")
    (app,) = config.apps
    assert (app.family, app.server, app.variant, app.critical) == ("img", "s1", "hf", True)
    assert config.repository == resolve_repository(None)  # $FAILSOFT_ZOO, where `failsoft zoo add` writes


def test_the_script_uses_the_example_builders():
    tree = ast.parse((BYOM / "make_models.py").read_text())
    called = {
        n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    assert {"image_classifier", "hf_image_exports"} <= called
