"""Low-resolution feeds: frames smaller than the smallest model's input, upscaled on the server."""

from __future__ import annotations

import dataclasses

import pytest

from failsoft.adaptation_data import LOW_RES_PX, efficientnet_ladder, upscaled_accuracy
from failsoft.errors import ConfigError
from failsoft.policies import registry
from failsoft.policies.adaptation.model import ClientSnapshot, Rung, Snapshot
from failsoft.policies.adaptation.network import frame_kbit, latency_budgets_ms


@pytest.fixture(scope="module")
def ladders():
    return efficientnet_ladder(), efficientnet_ladder(low_res_px=LOW_RES_PX)


def test_declared_accuracy_falls_with_the_frame_and_is_refused_where_undeclared() -> None:
    b0 = 0.77692
    values = [upscaled_accuracy(b0, px) for px in (128, 160, 192)]
    assert values == sorted(values) and values[-1] < b0
    # twice MobileNetV2's relative loss at 128 px (65.3 / 71.8)
    assert values[0] == pytest.approx(b0 * (1 - 2 * (1 - 65.3 / 71.8)))
    with pytest.raises(ConfigError, match="no declared accuracy"):
        upscaled_accuracy(b0, 96)
    with pytest.raises(ConfigError, match="no declared accuracy"):
        upscaled_accuracy(b0, 160, input_px=300)


def test_a_low_resolution_rung_needs_a_smaller_frame_and_a_lower_accuracy(ladders) -> None:
    b0 = ladders[0].rungs[0]
    with pytest.raises(ConfigError, match="both"):
        Rung(b0.variant, 224, frame_kbit(160), 160)
    with pytest.raises(ConfigError, match="below the model's input"):
        Rung(b0.variant, 224, frame_kbit(224), 224, 0.7)
    with pytest.raises(ConfigError, match="cannot score"):
        Rung(b0.variant, 224, frame_kbit(160), 160, 0.9)
    rung = Rung(b0.variant, 224, frame_kbit(160), 160, 0.7)
    assert (rung.px, rung.upscaled, rung.accuracy, rung.name) == (160, True, 0.7, "efficientnet_b0@160px")
    assert dataclasses.replace(rung, frame_px=None, frame_accuracy=None).accuracy == b0.accuracy


def test_the_ladder_orders_feeds_by_frame_size_at_the_model_cost(ladders) -> None:
    plain, low = ladders
    assert [r.px for r in low.rungs[:4]] == [128, 160, 192, 224]
    assert low.models == tuple(range(3, low.size))
    assert (low.latency_ms[:4] == plain.latency_ms[0]).all()  # B0 runs the upscaled frames
    assert list(low.accuracy[3:]) == list(plain.accuracy)


def test_edf_baselines_run_the_same_models_with_or_without_feeds(ladders) -> None:
    plain, low = ladders
    for name in ("edf-small", "edf-medium", "edf-large"):
        policy = registry.make("adaptation", name)
        a = policy.rung(Snapshot(plain, (), ()))
        b = policy.rung(Snapshot(low, (), ()))
        assert low.rungs[b].name == plain.rungs[a].name


def test_jellyfish_maps_a_client_in_a_dip_on_a_low_resolution_feed(ladders) -> None:
    # 2.9 Mbit/s, 25 fps: 224 px frames (5.2 Mbit/s) cannot be carried, 128 px ones (2.0) can
    plain, low = ladders
    plans = []
    for ladder in (plain, low):
        budgets = latency_budgets_ms(ladder, 100.0, 25.0, 2900.0, 1.0, 4.0)
        snap = Snapshot(ladder, (ClientSnapshot("dip", 25.0, budgets),), ("w0", "w1"))
        plans.append(registry.make("adaptation", "jellyfish", 0).plan(snap))
    assert plans[0].unserved == ("dip",)  # before: left unmapped, every frame dropped
    served = plans[1].worker_of("dip")
    assert plans[1].unserved == () and served is not None
    assert low.rungs[served.rung].px == 128
