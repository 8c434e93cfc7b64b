"""Normalisation: BatchNorm (with its BatchNormState) and LayerNorm.

BatchNorm follows the library's one train/eval switch: ``nnkit.train_mode(False)`` (or
``nnkit.eval_mode()``) as a context, read with ``nnkit.is_training()``; training is the default.
Notation: input x, scale γ (gamma), shift β (beta), output y, upstream gradient g; the means
below run over the normalised axes, n values each.
"""

__all__ = ['BatchNorm', 'BatchNormState', 'LayerNorm']
import numpy

from .. import backend, checks
from ..core import NetOp, NetVar
from ..hints import AppliedOp
from ..dtypes import get_dtype, wide
from ..modes import is_training
from .math import last_dot, last_sum
from .shape import narrowed, widened


class BatchNormState:
    """The running mean and variance of one BatchNorm layer: not trainable, never a NetVar.

    ``BatchNormState(features, momentum=0.1, eps=1e-5)``. Each training step updates, as
    PyTorch does, running = (1 − momentum) · running + momentum · batch, with the unbiased batch
    variance (n / (n − 1) times the biased one); evaluation normalises with them. The arrays
    follow the data's device and dtype at the first training step (evaluation reads them in
    the data's dtype and stores nothing). Because it is not a NetVar, ``FFN.vars``
    never lists it and optimizers never touch it. BatchNorm checks momentum, eps and the shapes
    of the running arrays again at each call, so a state edited into nonsense is refused.
    ``buffers`` names the arrays that ``Module.state()`` (and so ``nn.save``) saves.
    """
    buffers = ("running_mean", "running_var")
    counters = ("num_batches_tracked",)     # ints a training step adds to (nn.capture replays)

    def __init__(self, features, momentum=0.1, eps=1e-5):
        if not (checks.is_integer(features) and features > 0):
            raise ValueError(f"BatchNormState: features must be a positive int, got {features!r}")
        checks.in_range("BatchNormState", "momentum", momentum, 0, 1)
        checks.in_range("BatchNormState", "eps", eps, 0, low_open=True)
        self.features = int(features)
        self.momentum = momentum
        self.eps = eps
        self.reset()

    def reset(self):
        """Back to mean 0, variance 1 and no batches seen."""
        self.running_mean = numpy.zeros(self.features, dtype=get_dtype())
        self.running_var = numpy.ones(self.features, dtype=get_dtype())
        self.num_batches_tracked = 0

    def statistics(self, like):
        """(running_mean, running_var) on the device and in the dtype of the array ``like``:
        converted copies when they differ, the stored arrays untouched (an evaluation in
        float16 must not round them for good)."""
        xp = backend.array_module(like)
        return tuple(stored if backend.array_module(stored) is xp and stored.dtype == like.dtype
                     else xp.asarray(stored, dtype=like.dtype)
                     for stored in (self.running_mean, self.running_var))  # (each: loaded apart)

    def check_buffer(self, attribute, array, where):
        """Refuse a loaded running statistic that evaluation could not use: not finite, or a
        negative variance (every output NaN). ``Module.load_state`` calls it."""
        host = backend.to_cpu(array)
        if not numpy.isfinite(host).all():
            raise ValueError(f"{where}: the BatchNorm {attribute} holds values that are not "
                             "finite (NaN or inf)")
        if attribute == "running_var" and (host < 0).any():
            raise ValueError(f"{where}: the BatchNorm running_var holds negative values")

    def update(self, mean, var, n):
        """Fold one batch's mean and biased variance over n values into the running ones."""
        running_mean, running_var = self.statistics(mean)
        m = self.momentum
        self.running_mean = (1 - m) * running_mean + m * mean
        self.running_var = (1 - m) * running_var + m * var * (n / (n - 1))
        self.num_batches_tracked += 1

    def __repr__(self):
        return (f"BatchNormState(features={self.features}, momentum={self.momentum}, "
                f"eps={self.eps}, batches={self.num_batches_tracked})")


class _Normalization(NetOp):
    """Shared by BatchNorm and LayerNorm: y = γ · x̂ + β and its backward.

    ``stat_axes`` are the axes the statistics run over, ``param_axes`` those γ and β are
    broadcast along, ``pshape`` the shape γ and β take to broadcast against x.
    """
    __slots__ = ("xhat", "inv", "batch_stats", "has_gamma", "has_beta", "param_axes",
                 "pshape", "eps")

    def _check_parameters(self, x, gamma, beta):
        """Refuse a gamma or beta that is not a NetVar (or None) with one value per feature."""
        op = type(self).__name__
        features = x._data.shape[self.feature_axis]
        for name, p in (("gamma", gamma), ("beta", beta)):
            if p is None:
                continue
            if not isinstance(p, NetVar):
                raise TypeError(f"{op}: {name} must be a NetVar or None, got {type(p).__name__}")
            if p._data.size != features:
                raise ValueError(f"{op}: {name} of shape {tuple(p.shape)} does not match the "
                                 f"{features} features of x of shape {tuple(x.shape)}")
            if type(p._data) is not type(x._data):
                backend.check_same_device(op, x._data, p._data)

    def _affine(self, x, xhat, inv, gamma, beta, batch_stats):
        self.xhat, self.inv, self.batch_stats = xhat, inv, batch_stats
        self.has_gamma, self.has_beta = gamma is not None, beta is not None
        y = xhat
        if gamma is not None:
            y = y * gamma._data.reshape(self.pshape)
        if beta is not None:
            b = beta._data.reshape(self.pshape)
            if y is not xhat and y.dtype == b.dtype:
                y += b          # into γ·x̂'s fresh array: one array of x's size fewer
            else:
                y = y + b
        super().__init__(y, *(p for p in (x, gamma, beta) if p is not None))

    def _back(self, x, *params):
        gamma = params[0] if self.has_gamma else None
        beta = params[-1] if self.has_beta else None
        if x.requires_grad:
            # In place in dx̂'s own array where there is one (fresh temporaries of x's size
            # are a large part of a small network's step)
            if gamma is None:
                dxhat = self._g
            else:
                dxhat = self._g * gamma._data.reshape(self.pshape)
            if self.batch_stats:
                if self.stat_axes == (-1,):     # LayerNorm's rows: one pass each (math.py)
                    n, product = dxhat.shape[-1], None
                    mean_product, mean = last_dot(dxhat, self.xhat) / n, last_sum(dxhat) / n
                else:
                    product = dxhat * self.xhat
                    mean_product = product.mean(axis=self.stat_axes, keepdims=True)
                    mean = dxhat.mean(axis=self.stat_axes, keepdims=True)
                if dxhat is self._g:            # the upstream gradient may be shared
                    dxhat = dxhat - mean
                else:
                    dxhat -= mean
                dxhat -= backend.array_module(dxhat).multiply(self.xhat, mean_product,
                                                              out=product)
            if dxhat is self._g:
                dxhat = self.inv * dxhat
            else:
                dxhat *= self.inv
            x.accumulate(dxhat)
        if gamma is not None and gamma.requires_grad:
            gamma.accumulate((self._g * self.xhat).sum(axis=self.param_axes)
                             .reshape(gamma._data.shape))
        if beta is not None and beta.requires_grad:
            beta.accumulate(self._g.sum(axis=self.param_axes).reshape(beta._data.shape))

    def _composite(self, x, *params):
        # The value again from ops on nodes. With batch statistics, μ and σ² are functions of x
        # (their derivatives are the second-order terms); with running ones, constants.
        gamma = params[0] if self.has_gamma else None
        beta = params[-1] if self.has_beta else None
        if self.batch_stats:
            xw = widened(x)         # float16: σ² in float32, as the forward pass
            centred = xw - xw.mean(self.stat_axes, keepdims=True)
            var = (centred * centred).mean(self.stat_axes, keepdims=True)
            y = narrowed(centred * (var + self.eps) ** -0.5, x._data.dtype)
        else:
            y = (x - self.running_mean) * self.inv
        if gamma is not None:
            y = y * gamma.reshape(self.pshape)
        if beta is not None:
            y = y + beta.reshape(self.pshape)
        return y


def _standardize(xd, axes, eps):
    """(x̂, 1/σ, mean, biased variance) over ``axes``, all with the reduced axes kept (the
    mean and variance of float16 data in float32, for the running statistics)."""
    xp = backend.array_module(xd)
    xw = wide(xd)       # float16: σ² overflows at σ > 256 although x̂ and 1/σ fit
    rows = axes == (-1,)    # LayerNorm's rows: one pass each (math.py)
    mean = last_sum(xw) / xw.shape[-1] if rows else xw.mean(axis=axes, keepdims=True)
    centred = xw - mean
    var = last_dot(centred, centred) / xw.shape[-1] if rows else \
        (centred * centred).mean(axis=axes, keepdims=True)
    inv = 1 / xp.sqrt(var + eps)
    centred *= inv                                  # x̂, in the centred values' array
    return centred.astype(xd.dtype, copy=False), inv.astype(xd.dtype), mean, var


class BatchNorm(_Normalization, metaclass=AppliedOp):
    """Batch normalisation over the batch (and spatial) axes, per feature (channel) on axis 1.

    x is (B, F) or (B, C, H, W) (any (B, C, …)); γ and β hold F values (or are None).
    training:    μ, σ² = mean and biased variance of x over every axis but 1 (n values each)
                 x̂ = (x − μ) / √(σ² + eps),   y = γ · x̂ + β;   ``state`` gets μ and the
                 unbiased n/(n−1)·σ² (see BatchNormState)
                 dx = (γ / √(σ² + eps)) · (g − mean(g) − x̂ · mean(g · x̂))   (γ·g for g inside)
    evaluation:  x̂ = (x − running_mean) / √(running_var + eps);  dx = γ · g / √(running_var + eps)
    dγ = Σ g · x̂,  dβ = Σ g   (sums over every axis but 1)
    Training needs more than one value per feature. Every argument (and the state's momentum,
    eps and running arrays) is checked before the running statistics change, and they change
    only once the output exists: a refused call, detect_anomaly()'s included, leaves them as
    they were. Second derivatives rebuild y from ops, without updating the state again.
    """
    module_call = "layer"     # nn.BatchNorm(16) names nn.layers.BatchNorm (hints.AppliedOp)
    __slots__ = ("stat_axes", "running_mean")
    feature_axis = 1

    def __init__(self, x, gamma, beta, state):
        if not isinstance(state, BatchNormState):
            raise TypeError(f"BatchNorm: state must be a BatchNormState, got "
                            f"{type(state).__name__}")
        xd = x._data
        F = state.features
        if xd.ndim < 2 or xd.shape[1] != F:
            raise ValueError(f"BatchNorm: x of shape {tuple(x.shape)} needs (B, {F}"
                             f", ...) for a state of {F} features")
        self._check_parameters(x, gamma, beta)
        checks.in_range("BatchNorm", "state.momentum", state.momentum, 0, 1)
        checks.in_range("BatchNorm", "state.eps", state.eps, 0, low_open=True)
        for name in ("running_mean", "running_var"):
            shape = numpy.shape(getattr(state, name))
            if shape != (F,):
                raise ValueError(f"BatchNorm: state.{name} of shape {shape} does not match its "
                                 f"{F} features")
        training = is_training()
        n = xd.size // F
        if training and n < 2:
            raise ValueError(f"BatchNorm: training needs more than one value per feature, "
                             f"x has shape {tuple(x.shape)} (use eval_mode() for one sample)")
        self.stat_axes = self.param_axes = (0,) + tuple(range(2, xd.ndim))
        self.pshape = (1, F) + (1,) * (xd.ndim - 2)
        self.eps = state.eps
        if training:
            xhat, inv, mean, var = _standardize(xd, self.stat_axes, state.eps)
        else:
            xp = backend.array_module(xd)
            mean, var = state.statistics(xd)
            inv = 1 / xp.sqrt(var.reshape(self.pshape) + state.eps)
            self.running_mean = mean.reshape(self.pshape)       # for _composite
            xhat = (xd - mean.reshape(self.pshape)) * inv
        self._affine(x, xhat, inv, gamma, beta, training)
        if training:
            state.update(mean.reshape(-1), var.reshape(-1), n)


class LayerNorm(_Normalization, metaclass=AppliedOp):
    """Layer normalisation over the last axis (each row on its own, in training and evaluation).

    μ, σ² = mean and biased variance of x over the last axis (D values)
    x̂ = (x − μ) / √(σ² + eps),   y = γ · x̂ + β     (γ, β hold D values, or are None)
    dx = (γ / √(σ² + eps)) · (g − mean(g) − x̂ · mean(g · x̂))   (γ·g for g inside)
    dγ = Σ g · x̂,  dβ = Σ g   (sums over every axis but the last)
    eps must be positive and finite.
    """
    module_call = "layer"     # nn.LayerNorm(16) names nn.layers.LayerNorm (hints.AppliedOp)
    __slots__ = ()
    feature_axis = -1
    stat_axes = (-1,)

    def __init__(self, x, gamma=None, beta=None, eps=1e-5):
        checks.in_range("LayerNorm", "eps", eps, 0, low_open=True)
        xd = x._data
        if xd.ndim < 1 or xd.shape[-1] < 1:
            raise ValueError(f"LayerNorm: x of shape {tuple(x.shape)} has no last axis to "
                             "normalise")
        self._check_parameters(x, gamma, beta)
        self.param_axes = tuple(range(xd.ndim - 1))
        self.pshape = (xd.shape[-1],)
        self.eps = eps
        xhat, inv, _, _ = _standardize(xd, self.stat_axes, eps)
        self._affine(x, xhat, inv, gamma, beta, True)
