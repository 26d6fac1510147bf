"""An agent's device-memory figures, from the device report (:func:`failsoft.runtime.devices.device_memory`).

On a CPU the report of a GPU cannot be produced: the first test gives the collector one in the
report's own format (its keys are the contract). On a GPU (``tools/gpu-check``'s ``tests`` check
runs this file) the second reads the device for real, with a tensor allocated on it.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from failsoft.runtime import devices
from failsoft.runtime.agent_metrics import AgentMetrics

MB = 2**20


def device_figures(report: dict[str, Any] | None) -> dict[str, float]:
    metrics = AgentMetrics("g1", lambda: {"device": report, "budget_mb": 100, "rss_bytes": 1.0})
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["failsoft_agent_memory_budget_bytes"].samples[0].value == 100 * MB
    samples = families["failsoft_agent_device_memory_bytes"].samples
    assert all(s.labels["server"] == "g1" for s in samples)
    return {s.labels["kind"]: s.value for s in samples}


def test_the_device_report_becomes_bytes_by_kind_and_a_cpu_agent_reports_none():
    report = {"cuda": True, "total_mb": 81559.0, "free_mb": 80000.5, "process_mb": 500.0}
    report |= {"torch_reserved_mb": 20.0, "torch_allocated_mb": 10.0, "context_mb": 480.0}
    assert device_figures(report) == {
        "total": 81559.0 * MB,
        "free": 80000.5 * MB,
        "process": 500.0 * MB,
        "torch_reserved": 20.0 * MB,
    }
    assert device_figures({**report, "process_mb": None}).keys() == {"total", "free", "torch_reserved"}
    assert device_figures(None) == {} and device_figures({"cuda": False}) == {}


def test_on_a_gpu_the_figures_are_the_devices():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (tools/gpu-check runs this on a GPU)")
    held = torch.empty(64 * MB, dtype=torch.uint8, device="cuda")  # 64 MB through torch's allocator
    figures = device_figures(devices.device_memory("cuda"))
    del held
    assert 0 < figures["free"] < figures["total"]
    assert figures["torch_reserved"] >= 64 * MB
    if "process" in figures:  # NVML present: this process's use, its CUDA context included
        assert figures["process"] > figures["torch_reserved"]
