"""Policies stay pure: importing them must not pull in Ray, SimPy, FastAPI or torch."""

import json
import subprocess
import sys

FORBIDDEN = ["ray", "simpy", "fastapi", "torch", "transformers", "uvicorn"]


def imported_by(module: str) -> set[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {m.split(".")[0] for m in json.loads(done.stdout)}


def test_policies_import_no_runtime_library():
    loaded = imported_by(
        "failsoft.policies.registry, failsoft.policies.detection, failsoft.synth, failsoft.orchestration"
    )
    assert not loaded & set(FORBIDDEN), loaded & set(FORBIDDEN)


def test_the_package_and_its_cli_import_light():
    loaded = imported_by("failsoft, failsoft.cli")
    assert not loaded & {"ray", "torch", "transformers"}, loaded & set(FORBIDDEN)
