"""ParM's codes: exact on linear models, MDS for any r missing, the concat layout, bad input refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failsoft.errors import ConfigError, UnknownNameError
from failsoft.policies import registry
from failsoft.policies.coding.interface import K_MAX, K_MIN, R_MAX, R_MIN, code_matrix
from failsoft.policies.registry import get_decoder, get_encoder
from failsoft.services import CodedParams

RNG = np.random.default_rng(7)
W = RNG.normal(size=(10, 64)).astype(np.float32)  # a linear "model": F(x) = W x, no bias


def linear_model(x: np.ndarray) -> np.ndarray:
    return x @ W.T


def answers(encoder_name: str, k: int, r: int, queries: list[np.ndarray]) -> dict[int, np.ndarray]:
    """Every member's output when the parity models are F itself (exact for a linear F)."""
    parities = get_encoder(encoder_name, k, r).encode(queries)
    outs = [linear_model(q) for q in queries] + [linear_model(p) for p in parities]
    return dict(enumerate(outs))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_add_and_subtract_is_exact_for_a_linear_model(k):
    queries = [RNG.random(64, dtype=np.float32) for _ in range(k)]
    everyone = answers("add", k, 1, queries)
    decoder = get_decoder(k, 1)
    assert decoder.name == "sub"
    for j in range(k):
        got = decoder.decode({i: o for i, o in everyone.items() if i != j})
        assert list(got) == [j]
        np.testing.assert_allclose(got[j], linear_model(queries[j]), rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_r_missing_are_decoded_exactly_for_a_linear_model(data):
    k = data.draw(st.integers(K_MIN, K_MAX), label="k")
    r = data.draw(st.integers(2, R_MAX), label="r")
    n_batch = data.draw(st.sampled_from([None, 3]), label="batch")
    shape = (64,) if n_batch is None else (n_batch, 64)
    queries = [RNG.random(shape, dtype=np.float32) for _ in range(k)]
    everyone = answers("add", k, r, queries)
    missing = data.draw(st.sets(st.integers(0, k + r - 1), min_size=r, max_size=r), label="missing")
    got = get_decoder(k, r).decode({i: o for i, o in everyone.items() if i not in missing})
    assert got is not None and set(got) == {j for j in missing if j < k}
    for j, out in got.items():
        np.testing.assert_allclose(out, linear_model(queries[j]), rtol=1e-3, atol=1e-3)


def test_every_square_submatrix_of_the_code_is_invertible():
    """Any s missing data outputs are solvable from any s parity outputs (the code is MDS)."""
    g = code_matrix(K_MAX, R_MAX)
    for s in range(1, R_MAX + 1):
        for rows in itertools.combinations(range(R_MAX), s):
            for cols in itertools.combinations(range(K_MAX), s):
                assert np.linalg.det(g[np.ix_(rows, cols)]) > 0
    np.testing.assert_array_equal(code_matrix(2, 2), [[1, 1], [1, 2]])  # the paper's section 7 example


def test_linear_decoder_with_r_1_is_the_subtraction_decoder():
    queries = [RNG.random(64, dtype=np.float32) for _ in range(3)]
    everyone = answers("add", 3, 1, queries)
    del everyone[1]
    sub = get_decoder(3, 1).decode(everyone)
    lin = registry.make("coding", "linear", 3, 1).decode(everyone)
    np.testing.assert_allclose(sub[1], lin[1], rtol=1e-5, atol=1e-5)


def test_fewer_than_k_answers_decode_nothing():
    outs = {i: np.zeros(10, np.float32) for i in range(5)}
    assert get_decoder(3, 2).decode({0: outs[0], 3: outs[3]}) is None
    assert get_decoder(2, 1).decode({2: outs[2]}) is None
    assert get_decoder(2, 1).decode({0: outs[0], 1: outs[1]}) == {}  # nothing missing


def test_parity_target_weights_the_deployed_outputs():
    enc = get_encoder("add", 2, 2)
    outs = np.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_array_equal(enc.parity_target(outs, 0), [1.0, 1.0])
    np.testing.assert_array_equal(enc.parity_target(outs, 1), [1.0, 2.0])


def test_concat_k2_halves_the_width_and_places_left_right():
    image = np.arange(64, dtype=np.float32).reshape(8, 8)
    other = np.full((8, 8), 100.0, np.float32)
    (parity,) = get_encoder("concat", 2, 1).encode([image.ravel(), other.ravel()])
    tiled = parity.reshape(8, 8)
    np.testing.assert_array_equal(tiled[:, :4], (image[:, 0::2] + image[:, 1::2]) / 2)
    np.testing.assert_array_equal(tiled[:, 4:], 100.0)


def test_concat_k4_places_quadrants_and_keeps_batches_apart():
    batch = [np.full((5, 64), float(i + 1), np.float32) for i in range(4)]
    batch[0][1] = 9.0  # row 1 of query 0 differs: it must land only in row 1 of the parity batch
    (parity,) = get_encoder("concat", 4, 1).encode(batch)
    assert parity.shape == (5, 64)
    tiled = parity.reshape(5, 8, 8)
    for i, (top, left) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):
        assert np.all(tiled[0, top : top + 4, left : left + 4] == i + 1)
    assert np.all(tiled[1, :4, :4] == 9.0) and np.all(tiled[2, :4, :4] == 1.0)


def test_concat_with_r_2_scales_each_tile_by_its_coefficient():
    ones = [np.ones(64, np.float32)] * 2
    p0, p1 = get_encoder("concat", 2, 2).encode(ones)
    assert np.all(p0 == 1.0)
    assert np.all(p1.reshape(8, 8)[:, :4] == 1.0) and np.all(p1.reshape(8, 8)[:, 4:] == 2.0)


def test_the_bounds_are_those_of_coded_params():
    for k, r in itertools.product(range(K_MIN, K_MAX + 1), range(R_MIN, R_MAX + 1)):
        CodedParams(k=k, r=r)
        get_encoder("add", k, r)
    for k, r in [(K_MIN - 1, 1), (K_MAX + 1, 1), (2, R_MIN - 1), (2, R_MAX + 1)]:
        with pytest.raises(ValueError):
            CodedParams(k=k, r=r)
        with pytest.raises(ConfigError, match=f"got {k if not K_MIN <= k <= K_MAX else r}"):
            get_encoder("add", k, r)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: get_encoder("xor", 2), UnknownNameError, "unknown coding encoder 'xor' .*add, concat"),
        (lambda: get_encoder("sub", 2), UnknownNameError, "'sub'"),
        (lambda: get_encoder("add", True), ConfigError, "k must be an integer .* got True"),
        (lambda: get_encoder("add", 2, 1.5), ConfigError, "r must be .* got 1.5"),
        (lambda: get_encoder("concat", 3), ConfigError, r"k of 2 or 4 .*; got k=3"),
        (lambda: get_encoder("concat", 2, 1, (60,)), ConfigError, "60 is not square"),
        (lambda: get_encoder("concat", 4, 1, (3, 6, 5)), ConfigError, "6x5 is not even"),
        (lambda: get_encoder("add", 2).encode([np.zeros(64)] * 3), ConfigError, "k=2 got 3 queries"),
        (
            lambda: get_encoder("add", 2).encode([np.zeros(64), np.zeros(63)]),
            ConfigError,
            r"query 1 has shape \(63,\)",
        ),
        (
            lambda: get_encoder("add", 2).encode([np.zeros(32)] * 2),
            ConfigError,
            r"shape \(64,\).*got \(32,\)",
        ),
        (lambda: get_encoder("add", 2).encode([np.array(["a"] * 64)] * 2), ConfigError, "dtype"),
        (lambda: get_decoder(2).decode({3: np.zeros(2)}), ConfigError, r"must be in 0..2 .* got 3"),
        (lambda: get_decoder(2).decode({0: np.zeros(2), 2: np.zeros(3)}), ConfigError, "member 2 has shape"),
        (lambda: registry.make("coding", "sub", 2, 2), ConfigError, "r=1 codes; got r=2"),
        (lambda: get_encoder("add", 2, 1).parity_target(np.zeros((3, 10))), ConfigError, "expected 2"),
    ],
)
def test_bad_input_is_refused_naming_the_value(call, error, message):
    with pytest.raises(error, match=message):
        call()
