import numpy as np
import pytest

import nnkit as nn


def test_rand2_range_and_shape():
    w = nn.rand2(2, 3, seed=0)
    assert w.shape == (2, 3) and w.dtype == np.float32 and w.requires_grad
    limit = np.sqrt(3 / 2.5)
    assert np.all(np.abs(w.data) <= limit)
    big = nn.rand2(200, 300, seed=1)
    assert big.data.var() == pytest.approx(1 / 250, rel=0.05)
    assert nn.rand2(3).shape == (1, 3)


@pytest.mark.parametrize("init", [nn.rand2, nn.glorot, nn.he])
def test_seeded_and_reproducible(init):
    np.testing.assert_array_equal(init(4, 5, seed=7).data, init(4, 5, seed=7).data)
    nn.seed(3)
    a = init(4, 5).data
    nn.seed(3)
    np.testing.assert_array_equal(a, init(4, 5).data)
    assert not np.array_equal(init(4, 5, seed=1).data, init(4, 5, seed=2).data)


def test_fan_conventions():
    g = nn.glorot(400, 600, seed=0)
    assert g.data.var() == pytest.approx(2 / (400 + 600), rel=0.05)
    h = nn.he(500, 300, seed=0)
    assert h.data.var() == pytest.approx(2 / 500, rel=0.05)
    assert not nn.zeros(3, 2).data.any()


@pytest.mark.parametrize("shape, error, message", [
    ((0, 3), ValueError, r"got \(0, 3\)"),
    ((-2, 3), ValueError, r"got \(-2, 3\)"),
    ((), ValueError, r"got \(\)"),
    ((2.0, 3), TypeError, r"got \(2.0, 3\)"),
    ((True, 3), TypeError, r"got \(True, 3\)"),         # a bool is an int: (1, 3) before
    (((2, 3), 4), TypeError, r"got \(\(2, 3\), 4\)")])
def test_bad_shape(shape, error, message):
    with pytest.raises(error, match=f"glorot_uniform: shape must be positive integers, {message}"):
        nn.glorot(*shape)


@pytest.mark.parametrize("init", ["rand2", "gaussian", "uniform", "glorot_uniform",
                                  "glorot_normal", "he_normal", "he_uniform", "lecun_normal",
                                  "lecun_uniform", "orthogonal", "identity", "zeros"])
def test_every_initializer_names_itself_and_checks_its_seed(init):
    function = getattr(nn, init)
    with pytest.raises(ValueError, match=f"{init}: shape must be positive integers"):
        function(0, 2)
    for seed in (1.5, "0", True, np.random.default_rng(0).bit_generator):
        with pytest.raises(TypeError, match=f"{init}: seed must be None, an int or a "
                                            f"numpy.random.Generator, got {type(seed).__name__}"):
            function(2, 2, seed=seed)
    with pytest.raises(ValueError, match=f"{init}: seed must be >= 0, got -1"):
        function(2, 2, seed=-1)
    assert function(2, 2, seed=np.int64(3)).shape == (2, 2)


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.orthogonal(3, 3, gain=float("nan")), ValueError, "orthogonal: gain must be "
                                                                 "finite, got nan"),
    (lambda: nn.orthogonal(3, 3, gain="2"), TypeError, "orthogonal: gain must be a number, "
                                                       "got str '2'"),
    (lambda: nn.identity(3, 3, gain=float("inf")), ValueError, "identity: gain must be finite"),
    (lambda: nn.gaussian(3, std=float("inf")), ValueError, "gaussian: std must be finite"),
    (lambda: nn.gaussian(3, std=float("nan")), ValueError, "gaussian: std must be finite"),
    (lambda: nn.gaussian(3, mean=float("nan")), ValueError, "gaussian: mean must be finite"),
    (lambda: nn.gaussian(3, mean=None), TypeError, "gaussian: mean must be a number"),
    (lambda: nn.uniform(3, low=float("-inf")), ValueError, "uniform: low must be finite"),
    (lambda: nn.uniform(3, high=float("nan")), ValueError, "uniform: high must be finite"),
    (lambda: nn.uniform(3, low=1.0, high=0.0), ValueError, "uniform: low must be <= high")])
def test_distribution_parameters_must_be_finite_numbers(call, error, message):
    with pytest.raises(error, match=message):
        call()


ALL = [nn.rand2, nn.gaussian, nn.uniform, nn.glorot_uniform, nn.glorot_normal, nn.he_normal,
       nn.he_uniform, nn.lecun_normal, nn.lecun_uniform, nn.orthogonal]


@pytest.mark.parametrize("init", ALL)
def test_every_random_initializer_is_seeded(init):
    a = init(6, 5, seed=3)
    assert a.shape == (6, 5) and a.dtype == np.float32 and a.requires_grad
    np.testing.assert_array_equal(a.data, init((6, 5), seed=3).data)
    nn.seed(11)
    b = init(6, 5).data
    nn.seed(11)
    np.testing.assert_array_equal(b, init(6, 5).data)
    assert not np.array_equal(init(6, 5, seed=1).data, init(6, 5, seed=2).data)


@pytest.mark.parametrize("init, variance", [
    (nn.glorot_normal, 2 / (300 + 500)), (nn.glorot_uniform, 2 / (300 + 500)),
    (nn.he_normal, 2 / 300), (nn.he_uniform, 2 / 300),
    (nn.lecun_normal, 1 / 300), (nn.lecun_uniform, 1 / 300)])
def test_variances_follow_the_in_out_fan_convention(init, variance):
    w = init(300, 500, seed=0).data
    assert w.var() == pytest.approx(variance, rel=0.03)
    assert abs(w.mean()) < 0.1 * np.sqrt(variance)


def test_uniform_limits_and_gaussian_moments():
    u = nn.uniform(200, 200, low=-0.3, high=0.1, seed=0).data
    assert u.min() >= -0.3 and u.max() < 0.1 and u.mean() == pytest.approx(-0.1, abs=0.005)
    g = nn.gaussian(200, 200, std=0.5, mean=1.0, seed=0).data
    assert g.mean() == pytest.approx(1.0, abs=0.01) and g.std() == pytest.approx(0.5, rel=0.02)
    limit = np.sqrt(6 / (3 + 4))
    assert np.abs(nn.glorot_uniform(3, 4, seed=0).data).max() <= limit


def test_convolution_kernel_fans():
    # (out_channels, in_channels, kh, kw): fan_in = 16 * 9
    w = nn.he_normal(64, 16, 3, 3, seed=0).data
    assert w.shape == (64, 16, 3, 3) and w.var() == pytest.approx(2 / (16 * 9), rel=0.05)
    w = nn.glorot_normal(64, 16, 3, 3, seed=0).data
    assert w.var() == pytest.approx(2 / (16 * 9 + 64 * 9), rel=0.05)


@pytest.mark.parametrize("shape", [(5, 5), (3, 7), (7, 3), (4, 2, 3)])
def test_orthogonal(shape):
    q = nn.orthogonal(*shape, gain=2.0, seed=0).data.astype(np.float64)
    flat = q.reshape(shape[0], -1) / 2.0
    small = min(flat.shape)
    gram = flat @ flat.T if flat.shape[0] == small else flat.T @ flat
    np.testing.assert_allclose(gram, np.eye(small), atol=1e-6)


def test_identity():
    np.testing.assert_array_equal(nn.identity(2, 3, gain=0.5).data, [[0.5, 0, 0], [0, 0.5, 0]])
    with pytest.raises(ValueError, match="identity: needs a 2-D shape"):
        nn.identity(2, 2, 2)


def test_old_names_are_the_same_functions():
    assert nn.glorot is nn.glorot_uniform and nn.he is nn.he_normal
    with pytest.raises(ValueError, match="gaussian: std"):
        nn.gaussian(2, 2, std=-1)


@pytest.mark.parametrize("value, error, message", [
    (None, TypeError, r"seed: seed must be an int, got NoneType None"),   # reseeded randomly
    (True, TypeError, r"seed: seed must be an int, got bool True"),
    (1.5, TypeError, r"got float 1.5"),
    ("a", TypeError, r"got str 'a'"),
    (-1, ValueError, r"seed: seed must be >= 0, got -1")])
def test_nn_seed_takes_only_an_int(value, error, message):
    nn.seed(3)
    expected = nn.glorot(2, 2).data
    nn.seed(3)
    with pytest.raises(error, match=message):
        nn.seed(value)
    np.testing.assert_array_equal(nn.glorot(2, 2).data, expected)   # the generator is untouched
    nn.seed(np.int64(3))
    np.testing.assert_array_equal(nn.glorot(2, 2).data, expected)


def test_initial_values_that_the_dtype_cannot_hold_are_refused():
    # finite arguments gave inf weights with only NumPy's overflow warning
    with pytest.raises(ValueError, match="gaussian: the values drawn do not fit float32"):
        nn.gaussian(2, 2, mean=1e39)
    previous = nn.dtypes.get_dtype()
    nn.set_dtype(np.float16)
    try:
        with pytest.raises(ValueError, match="identity: the values drawn do not fit float16"):
            nn.identity(2, 2, gain=1e5)
        with pytest.raises(ValueError, match="recurrent_weights: .* float16"):
            nn.recurrent_weights("lstm", 2, 3, forget_bias=1e5)
    finally:
        nn.set_dtype(previous)
