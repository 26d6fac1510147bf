"""The profiler measures: memory, cold loads, latency per batch size, throughput, the machine."""

from __future__ import annotations

import statistics

import pytest

from failsoft.errors import CorruptModelError
from failsoft.zoo import ProfileSettings, profile_variant
from failsoft.zoo.layout import WEIGHTS_FILE
from failsoft.zoo.profiler import QUICK


def test_profile_holds_every_measurement(tiny_zoo):
    p = tiny_zoo.profile("digits_mlp", "mlp_l")
    assert p["parameter_bytes"] >= 4 * p["parameters"]
    assert p["memory_mb"] >= p["parameter_bytes"] / 2**20
    assert p["memory"]["rss_growth_mb"] > 0
    assert len(p["load"]["samples_ms"]) == QUICK.loads
    assert p["load_ms"] == pytest.approx(sorted(p["load"]["samples_ms"])[QUICK.loads // 2], abs=1e-3)
    # each cold load's CPU time (the work; the rest waited for the disk) and warm loads after them
    assert len(p["load"]["cpu_samples_ms"]) == QUICK.loads
    assert 0 < p["load_cpu_ms"] <= p["load_ms"]
    assert len(p["load"]["warm_samples_ms"]) == QUICK.warm_loads > 0
    assert p["warm_load_ms"] == pytest.approx(statistics.median(p["load"]["warm_samples_ms"]), abs=1e-3)
    variant = tiny_zoo.variant("digits_mlp", "mlp_l")  # the domain model carries both
    assert (variant.load_cpu_ms, variant.warm_load_ms) == (p["load_cpu_ms"], p["warm_load_ms"])
    assert set(p["latency"]) == {str(b) for b in QUICK.batch_sizes}
    for bs, lat in p["latency"].items():
        assert 0 < lat["p50_ms"] <= lat["p99_ms"]
        assert lat["samples"] >= QUICK.min_iters
        assert lat["throughput_rps"] == pytest.approx(int(bs) * 1000 / lat["mean_ms"])
    assert p["latency_ms"] == pytest.approx(p["latency"]["1"]["p50_ms"], abs=1e-4)
    machine = p["machine"]
    assert machine["device"] == "cpu" and machine["torch"] and machine["cpu_count_logical"] >= 1
    assert machine["torch_threads"] == QUICK.threads
    assert p["weights_sha256"] == tiny_zoo.config("digits_mlp", "mlp_l").weights_sha256


def test_load_time_grows_with_model_size(tiny_zoo):
    fam = tiny_zoo.families()[0]
    by_size = sorted(fam.variants, key=lambda v: tiny_zoo.config(fam.name, v.name).weights_bytes)
    smallest, largest = by_size[0], by_size[-1]
    assert (
        tiny_zoo.config(fam.name, largest.name).weights_bytes
        > 1000 * tiny_zoo.config(fam.name, smallest.name).weights_bytes
    )
    assert largest.load_ms > 1.5 * max(v.load_ms for v in by_size[:-1])
    assert largest.memory_mb > smallest.memory_mb


def test_profiling_a_corrupt_variant_raises_the_same_error(zoo_copy):
    path = zoo_copy.variant_dir("digits_mlp", "mlp_s") / WEIGHTS_FILE
    path.write_bytes(b"garbage")
    with pytest.raises(CorruptModelError, match=r"mlp_s/model\.safetensors"):
        profile_variant(zoo_copy, "digits_mlp", "mlp_s", QUICK, device="cpu")


def test_the_default_settings_cover_batch_sizes_1_to_16():
    assert ProfileSettings().batch_sizes == (1, 2, 4, 8, 16)
    with pytest.raises(ValueError):
        ProfileSettings(batch_sizes=(0,))


@pytest.mark.slow  # profiles a variant beside busy threads: seconds of CPU
def test_a_profile_says_what_else_kept_the_host_busy(zoo_copy):
    import subprocess
    import sys

    from failsoft.zoo.machine import usable_cores
    from failsoft.zoo.profiler import contended

    quiet = profile_variant(zoo_copy, "digits_mlp", "mlp_s", QUICK, device="cpu")
    host = quiet["host"]
    assert 0 <= host["probe_cores"] <= usable_cores() + 0.05 and host["busy_cores"] >= 0
    assert host["others_busy_cores"] == pytest.approx(
        max(host["busy_cores"] - host["probe_cores"], 0), abs=2e-3
    )
    # every core kept busy by other processes: the profile is marked contended (its times inflated)
    spin = "import time\nt=time.time()\nwhile time.time()-t<60: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(usable_cores())]
    try:
        crowded = profile_variant(zoo_copy, "digits_mlp", "mlp_s", QUICK, device="cpu")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert crowded["host"]["others_busy_cores"] > 0.5 and contended(crowded)
    assert contended(crowded) != contended({"host": {}})
