"""Fused recurrent layers over time-major (T, B, F) sequences.

The fused ops ``RNN``, ``LSTM`` and ``GRU`` are ONE node each for a whole (ragged) batch of
sequences: the loop over time runs inside the constructor, and ``_back`` does
backpropagation through time in one pass. Weights are row-oriented like the rest of nnkit:
W is (F, k·H) and R is (H, k·H) with the k gates side by side in PyTorch's order, so a PyTorch
layer converts with ``W = weight_ih_l0.T``, ``R = weight_hh_l0.T`` and
``b = bias_ih_l0 + bias_hh_l0`` (GRU: ``b = stack([bias_ih_l0, bias_hh_l0])``).

Ragged batches: ``lengths`` (B,) gives each sequence's true length. The batch is sorted by
length once (longest first), so the sequences still running at step t are the first n_t rows,
and each step computes on those rows only: padding costs nothing. Past its length a sequence's
state is frozen and its outputs are zero; ``op.final`` (and ``op.final_c`` for the LSTM) is
the (B, H) state of each sequence at its own last step, a node usable downstream. Padded steps
add nothing to any gradient.

The per-step cells with the same weights (``RNNCell``, ``LSTMCell``, ``GRUCell``) are in
``cells``: an unrolled loop of cells gives the fused op's values and gradients. Second
derivatives (``grad(create_graph=True)``) go through such a loop: ``registry``, which sits above
this module and the cells, attaches it to the fused ops as ``_unrolled`` (see ``_composite``).
"""

import weakref

import numpy

from ... import backend, checks
from ...core import NetOp, NetVar, Output, constant
from ...hints import AppliedOp
from .activations import ACTIVATIONS, sigmoid_, tanh_
from .validation import _check_state, _check_weights, _lengths, _node, _shape


# ----------------------------------------------------------------------------- fused ops

class _Recurrent(NetOp):
    """The shared machinery of RNN, LSTM and GRU: validation, sorting and packing the ragged
    batch, the input projection, the final states and the input-side gradients.

    Packed layout: the valid (t, row) positions in time-major order with the rows sorted by
    length (longest first), so step t owns the contiguous block
    ``offsets[t]:offsets[t] + sizes[t]`` and its rows continue the first ``sizes[t]`` rows of
    step t − 1. Every per-step array (inputs, states, gate values, their gradients) is packed.
    """
    __slots__ = ("steps", "dense", "rows", "shape3", "order", "sizes", "offsets", "packed_inputs",
                 "initial", "hidden", "final_position", "_final_refs")
    gates = 1          # k: W is (F, k·H)
    states = 1         # 1 (h) or 2 (h, c)
    two_biases = False     # b is [b_i; b_h] (2, k·H) rather than one (k·H,) bias

    def __init__(self, x, W, R, b, h0=None, c0=None, lengths=None):
        op = type(self).__name__
        x = x if isinstance(x, NetVar) else constant(x)
        W, R, b = (_node(v, op, name) for v, name in ((W, "W"), (R, "R"), (b, "b")))
        h0, c0 = _node(h0, op, "h0"), _node(c0, op, "c0")
        xd, Wd, Rd, bd = x._data, W._data, R._data, b._data
        xp = backend.array_module(xd)
        if any(backend.array_module(a) is not xp for a in (Wd, Rd, bd)):
            backend.check_same_device(op, xd, Wd, Rd, bd)
        if xd.ndim != 3:
            raise ValueError(f"{op}: x of shape {_shape(xd)} must be 3-D (T, B, F), time-major")
        T, B, F = xd.shape
        if T == 0 or B == 0:
            raise ValueError(f"{op}: x of shape {_shape(xd)} holds no step (T = {T}) or no "
                             f"sequence (B = {B}); every sequence needs at least one step")
        H = _check_weights(op, self.gates, xd, Wd, Rd, bd, self.two_biases)
        _check_state(op, "h0", h0, B, H)
        _check_state(op, "c0", c0, B, H)
        lengths = _lengths(op, lengths, T, B)

        # sort once, longest first; sizes[t] sequences are still running at step t
        order = numpy.argsort(-lengths, kind="stable")
        sorted_lengths = lengths[order]
        steps = int(sorted_lengths[0])
        running = numpy.arange(steps)[:, None] < sorted_lengths[None, :]
        sizes = running.sum(axis=1)
        offsets = numpy.concatenate(([0], numpy.cumsum(sizes)))
        self.dense = int(sorted_lengths[-1]) == T      # no padding: nothing to pack
        if self.dense:
            self.rows = None
            packed_inputs = xd.reshape(T * B, F)
        else:
            t, j = numpy.nonzero(running)
            self.rows = xp.asarray(t * B + order[j])      # packed position -> row of (T·B)
            packed_inputs = xd.reshape(T * B, F)[self.rows]
        self.shape3 = (T, B, F, H)
        self.steps = T              # graph drawings show the op as one box over T steps
        self.order = xp.asarray(order)
        self.sizes, self.offsets = sizes.tolist(), offsets.tolist()
        self.packed_inputs = packed_inputs

        projected = packed_inputs @ Wd              # the input projection, all steps at once
        projected += self._input_bias(bd)
        dtype = projected.dtype
        self.initial = initial = [self._sorted_state(s, B, H, dtype, xp)
                                  for s in (h0, c0)[:self.states]]
        packed = self._forward(projected, Rd, bd, initial, xp)      # packed outputs (N, H)
        self.hidden = packed

        # each sequence's final state sits at packed position offsets[L − 1] + (its sorted row)
        last = offsets[sorted_lengths - 1] + numpy.arange(B)
        final_position = numpy.empty(B, dtype=numpy.int64)
        final_position[order] = last
        self.final_position = xp.asarray(final_position)
        self._final_refs = [None] * self.states

        if self.dense:
            y = packed.reshape(T, B, H)
        else:
            y = xp.zeros((T, B, H), dtype=dtype)
            y.reshape(T * B, H)[self.rows] = packed
        parents = (x, W, R, b, h0 if h0 is not None else constant(xp.zeros((1, H), dtype)))
        if self.states == 2:
            parents += (c0 if c0 is not None else constant(xp.zeros((1, H), dtype)),)
        super().__init__(y, *parents)

    # -- pieces a subclass may change
    def _input_bias(self, bd):
        return bd.reshape(-1)

    def _sorted_state(self, state, B, H, dtype, xp):
        if state is None:
            return xp.zeros((B, H), dtype=dtype)
        return xp.broadcast_to(state._data, (B, H))[self.order].astype(dtype, copy=False)

    def _steps(self, backward=False):
        """(t, s, n) for each step: its packed rows are s:s + n."""
        steps = zip(range(len(self.sizes)), self.offsets, self.sizes)
        return reversed(list(steps)) if backward else steps

    def _previous(self, packed, initial, t, n):
        """The (n, H) states that step t starts from."""
        if t == 0:
            return initial[:n]
        start = self.offsets[t - 1]
        return packed[start:start + n]

    def _shifted(self, packed, initial):
        """The packed states each step starts from (h_{t−1} for every valid position)."""
        xp = backend.array_module(packed)
        if self.dense:
            return xp.concatenate((initial, packed[:len(packed) - len(initial)]))
        previous = xp.empty_like(packed)
        for t, s, n in self._steps():
            previous[s:s + n] = self._previous(packed, initial, t, n)
        return previous

    # -- the final states
    def _final(self, which):
        ref = self._final_refs[which]
        node = ref() if ref is not None else None
        # A node built under no_grad() is a constant: not the one to hand out once grad mode
        # is back on (its gradient would be dropped); nor is another op's (a copy's original).
        if node is None or (self.requires_grad and not node._parents) or (
                node._parents and node._parents[0] is not self):
            node = RecurrentState(self, which)
            self._final_refs[which] = weakref.ref(node)
        return node

    def __getstate__(self):
        """Copies and pickles leave the final-state nodes behind (weak references, which
        pickle cannot store, to the original's nodes): a copy makes its own."""
        state = super().__getstate__()
        attributes, slots = state if isinstance(state, tuple) else (state, None)
        if slots and "_final_refs" in slots:
            slots = {**slots, "_final_refs": [None] * len(slots["_final_refs"])}
        return attributes, slots

    @property
    def final(self):
        """The (B, H) hidden state of each sequence at its own last step (a node)."""
        return self._final(0)

    def _sequence_lengths(self):
        """Each sequence's length (host int64 (B,)), read back from the sorted layout: sorted
        row j runs at step t while j < sizes[t]."""
        B = self.shape3[1]
        sorted_lengths = (numpy.asarray(self.sizes)[:, None] > numpy.arange(B)).sum(axis=0)
        lengths = numpy.empty(B, dtype=numpy.int64)
        lengths[backend.to_cpu(self.order)] = sorted_lengths
        return lengths

    # -- second derivatives
    def _composite(self, x, W, R, b, *initial):
        """The outputs rebuilt as a loop of this op's cells (``cells._unrolled``): the same
        values, built from ops that can be differentiated again."""
        return self._unrolled(x, W, R, b, *initial)[0]

    # -- backpropagation through time
    def _back(self, x, W, R, b, *initial):
        xp = backend.array_module(self._data)
        T, B, F, H = self.shape3
        if self.dense:
            G = self._g.reshape(T * B, H).copy()
        else:
            G = self._g.reshape(T * B, H)[self.rows]
        # the carries BPTT starts from: zeros for h (final h's gradient is in G already, at each
        # sequence's last step) and c's final gradient, handed over by the engine (final_c is
        # output 1), in the sorted order; a sequence's row is untouched until its last step
        handed = self.output_grads()
        carries = [xp.zeros((B, H), G.dtype)]
        if self.states == 2:
            gc = handed.get(1)
            carries.append(xp.zeros((B, H), G.dtype) if gc is None
                           else xp.asarray(gc[self.order], dtype=G.dtype))
        dA, dAh = self._bptt(G, R._data, carries, xp)
        # dA: gradient of the input pre-activations (x·W + b); dAh: of the recurrent ones
        if x.requires_grad:
            dXp = dA @ W._data.T
            if self.dense:
                x.accumulate(dXp.reshape(T, B, F))
            else:
                dx = xp.zeros((T * B, F), dtype=dXp.dtype)
                dx[self.rows] = dXp
                x.accumulate(dx.reshape(T, B, F))
        if W.requires_grad:
            W.accumulate(self.packed_inputs.T @ dA)
        if b.requires_grad:
            b.accumulate(self._bias_gradient(dA, dAh).reshape(b._data.shape))
        if R.requires_grad:
            R.accumulate(self._shifted(self.hidden, self.initial[0]).T @ dAh)
        inverse = xp.empty_like(self.order)
        inverse[self.order] = xp.arange(B)
        for state, carry in zip(initial, carries):
            if state.requires_grad:
                state.accumulate(carry[inverse])

    def _bias_gradient(self, dA, dAh):
        return dA.sum(axis=0)


class RecurrentState(NetOp):
    """The final state of a fused recurrent op: row b is the state after step lengths[b] − 1.

    y = h_{L_b − 1}[b]  (or c for an LSTM's ``final_c``), shape (B, H)
    d(op) = g at (L_b − 1, b) for h: h is the op's output at each sequence's last step, so
    ``final``'s one parent is the op and its gradient lands in the op's ``.g``. c is not among
    the outputs: ``final_c`` is the op's output 1 (a ``FinalCellState``, an engine ``Output``),
    whose gradient the engine hands to the op's BPTT.
    Get them as ``op.final`` / ``op.final_c``; the same node is returned while it is alive.
    """
    __slots__ = ()
    which = 0

    def __new__(cls, op=None, which=0):       # (op None: unpickling)
        return object.__new__(FinalCellState if cls is RecurrentState and which == 1 else cls)

    def __init__(self, op, which=0):
        self._check(op, which)
        super().__init__(op.hidden[op.final_position], op)

    @staticmethod
    def _check(op, which):
        if not isinstance(op, _Recurrent):
            raise TypeError(f"RecurrentState: op must be an RNN, LSTM or GRU node, got "
                            f"{type(op).__name__}")
        if not checks.is_integer(which):
            raise TypeError(f"RecurrentState: which must be 0 (h) or 1 (an LSTM's c), got "
                            f"{which!r}")
        if which not in range(op.states):
            raise ValueError(f"RecurrentState: {type(op).__name__} has {op.states} final "
                             f"state(s), no state {which!r}")

    def _back(self, op):
        xp = backend.array_module(self._data)
        T, B, _, H = op.shape3
        outputs = xp.zeros((T * B, H), dtype=op._data.dtype)
        outputs[op.final_position if op.dense else op.rows[op.final_position]] = self._g
        op.accumulate_same_shape(outputs.reshape(T, B, H))

    def _composite(self, op):
        last = op._sequence_lengths() - 1       # h, picked from the op's outputs
        return op[last, numpy.arange(len(last))]


class FinalCellState(Output, RecurrentState):
    """An LSTM's final cell state, ``op.final_c``: the op's output 1 (see RecurrentState)."""
    __slots__ = ()
    which = 1
    _composite = None       # differentiated twice through the op's composite, as its output 1

    def __init__(self, op, which=1):
        self._check(op, which)
        Output.__init__(self, op, 1, op.cell_states[op.final_position])


class RNN(_Recurrent, metaclass=AppliedOp):
    """Fused simple recurrent layer (Brainstorm's), one node for a whole ragged batch.

    a_t = x_t·W + y_{t−1}·R + b,   y_t = f(a_t),   y_{−1} = h0 (zeros when None)
    backward (t = L−1 … 0):   dy_t = g_t + da_{t+1}·Rᵀ   (+ g of ``final`` at t = L−1)
        da_t = dy_t · f′(a_t);  dx_t = da_t·Wᵀ;  dW = Σ_t x_tᵀ·da_t;  dR = Σ_t y_{t−1}ᵀ·da_t;
        db = Σ_t Σ_rows da_t;  dh0 = da_0·Rᵀ
    x (T, B, F); W (F, H); R (H, H); b (H,) or (1, H); h0 (B, H) or (1, H); lengths (B,) in 1..T
    (None: all T). f = ``activation``: 'tanh' (default), 'relu', 'sigmoid' or 'linear'.
    The node's data is y (T, B, H), zero at t ≥ lengths[b]; ``.final`` is the (B, H) state of
    each sequence at its own last step. PyTorch ``nn.RNN``: W = weight_ih_l0ᵀ,
    R = weight_hh_l0ᵀ, b = bias_ih_l0 + bias_hh_l0 (``nonlinearity`` = activation).
    """
    module_call = "layer"     # nn.RNN(16) names nn.layers.RNN (hints.AppliedOp)
    __slots__ = ("activation",)
    activations = tuple(sorted(ACTIVATIONS))     # the names ``activation`` accepts

    def __init__(self, x, W, R, b, h0=None, lengths=None, activation='tanh'):
        if activation not in ACTIVATIONS:
            raise ValueError(f"RNN: activation must be one of {sorted(ACTIVATIONS)}, got "
                             f"{activation!r}")
        self.activation = activation
        super().__init__(x, W, R, b, h0=h0, lengths=lengths)

    def _forward(self, projected, R, b, initial, xp):
        f = ACTIVATIONS[self.activation][0]
        h0 = initial[0]
        for t, s, n in self._steps():
            a = projected[s:s + n]                     # becomes y_t in place
            a += self._previous(projected, h0, t, n) @ R
            f(a)
        return projected

    def _bptt(self, G, R, carries, xp):
        derivative = ACTIVATIONS[self.activation][1]
        dh = carries[0]
        RT = R.T
        outputs = self.hidden
        for t, s, n in self._steps(backward=True):
            da = G[s:s + n]                            # becomes da_t in place
            da += dh[:n]
            if derivative is not None:
                da *= derivative(outputs[s:s + n])
            xp.matmul(da, RT, out=dh[:n])
        return G, G


class LSTM(_Recurrent, metaclass=AppliedOp):
    """Fused long short-term memory layer, one node for a whole ragged batch.

    [i f g o] = x_t·W + h_{t−1}·R + b   (gates side by side, PyTorch's order)
    i, f, o = σ(·), g = tanh(·);  c_t = f·c_{t−1} + i·g;  h_t = y_t = o·tanh(c_t)
    backward (t = L−1 … 0):  dh_t = g_t + dz_{t+1}·Rᵀ;
        dc_t = dc_{t+1}·f_{t+1} + dh_t·o·(1 − tanh² c_t)
        dz = [dc·g·i(1−i), dc·c_{t−1}·f(1−f), dc·i·(1−g²), dh·tanh(c_t)·o(1−o)]
        dx_t = dz·Wᵀ;  dW = Σ x_tᵀ·dz;  dR = Σ h_{t−1}ᵀ·dz;  db = Σ dz;  dh0 = dz_0·Rᵀ;
        dc0 = dc_0·f_0
    x (T, B, F); W (F, 4H); R (H, 4H); b (4H,) or (1, 4H); h0, c0 (B, H) or (1, H); lengths (B,).
    The node's data is y (T, B, H); ``.final`` and ``.final_c`` are each sequence's h and c at
    its own last step. PyTorch ``nn.LSTM``: W = weight_ih_l0ᵀ, R = weight_hh_l0ᵀ,
    b = bias_ih_l0 + bias_hh_l0 (a forget-gate bias of 1 is b[H:2H] = 1).
    """
    module_call = "layer"     # nn.LSTM(16) names nn.layers.LSTM (hints.AppliedOp)
    __slots__ = ("cell_states", "tanh_cells", "gate_values")
    gates = 4
    states = 2
    n_outputs = 2       # y and, as output 1, final_c

    def __init__(self, x, W, R, b, h0=None, c0=None, lengths=None):
        super().__init__(x, W, R, b, h0=h0, c0=c0, lengths=lengths)

    @property
    def final_c(self):
        """The (B, H) cell state of each sequence at its own last step (a node)."""
        return self._final(1)

    def _composite(self, x, W, R, b, h0, c0):
        y, _, c = self._unrolled(x, W, R, b, h0, c0)
        return y, c

    def _forward(self, projected, R, b, initial, xp):
        H = R.shape[0]
        h0, c0 = initial
        N = projected.shape[0]
        self.cell_states = cells = xp.empty((N, H), projected.dtype)
        self.tanh_cells = tanh_cells = xp.empty((N, H), projected.dtype)
        outputs = xp.empty((N, H), projected.dtype)
        for t, s, n in self._steps():
            z = projected[s:s + n]                     # becomes [i f g o] in place
            z += self._previous(outputs, h0, t, n) @ R
            sigmoid_(z[:, :2 * H])
            tanh_(z[:, 2 * H:3 * H])
            sigmoid_(z[:, 3 * H:])
            c = cells[s:s + n]
            xp.multiply(z[:, H:2 * H], self._previous(cells, c0, t, n), out=c)
            c += z[:, :H] * z[:, 2 * H:3 * H]
            xp.tanh(c, out=tanh_cells[s:s + n])
            xp.multiply(z[:, 3 * H:], tanh_cells[s:s + n], out=outputs[s:s + n])
        self.gate_values = projected
        return outputs

    def _bptt(self, G, R, carries, xp):
        H = R.shape[0]
        dh, dc = carries
        RT = R.T
        gate_values, cells, tanh_cells = self.gate_values, self.cell_states, self.tanh_cells
        c0 = self.initial[1]
        dZ = xp.empty_like(gate_values)
        for t, s, n in self._steps(backward=True):
            step = gate_values[s:s + n]
            i, f, g, o = step[:, :H], step[:, H:2 * H], step[:, 2 * H:3 * H], step[:, 3 * H:]
            tc = tanh_cells[s:s + n]
            dht = G[s:s + n]
            dht += dh[:n]
            dct = dc[:n]
            dct += dht * o * (1 - tc * tc)
            dz = dZ[s:s + n]
            xp.multiply(dct * g, i * (1 - i), out=dz[:, :H])
            xp.multiply(dct * self._previous(cells, c0, t, n), f * (1 - f), out=dz[:, H:2 * H])
            xp.multiply(dct * i, 1 - g * g, out=dz[:, 2 * H:3 * H])
            xp.multiply(dht * tc, o * (1 - o), out=dz[:, 3 * H:])
            dct *= f
            xp.matmul(dz, RT, out=dh[:n])
        return dZ, dZ


class GRU(_Recurrent, metaclass=AppliedOp):
    """Fused gated recurrent unit (PyTorch's convention), one node for a whole ragged batch.

    [a_r a_z a_n] = x_t·W + b_i,   [u_r u_z u_n] = h_{t−1}·R + b_h   (gates r, z, n in order)
    r = σ(a_r + u_r),  z = σ(a_z + u_z),  n = tanh(a_n + r·u_n),  h_t = y_t = (1 − z)·n + z·h_{t−1}
    backward (t = L−1 … 0):  dh_t = g_t + (carried from step t+1)
        dn = dh_t·(1 − z)·(1 − n²);  dz = dh_t·(h_{t−1} − n)·z(1 − z);  dr = dn·u_n·r(1 − r)
        input side  da = [dr, dz, dn]:    dx_t = da·Wᵀ;  dW = Σ x_tᵀ·da;  db_i = Σ da
        recurrent   du = [dr, dz, dn·r]:  dR = Σ h_{t−1}ᵀ·du;  db_h = Σ du;
        carried to step t−1:  dh_t·z + du·Rᵀ  (dh0 at t = 0)
    x (T, B, F); W (F, 3H); R (H, 3H); b (2, 3H) = [b_i; b_h] (the reset gate scales
    h_{t−1}·R_n + b_h,n, so the two biases differ); h0 (B, H) or (1, H); lengths (B,).
    PyTorch ``nn.GRU``: W = weight_ih_l0ᵀ, R = weight_hh_l0ᵀ, b = stack([bias_ih_l0, bias_hh_l0]).
    """
    module_call = "layer"     # nn.GRU(16) names nn.layers.GRU (hints.AppliedOp)
    __slots__ = ("recurrent_share", "gate_values")
    gates = 3
    two_biases = True

    def __init__(self, x, W, R, b, h0=None, lengths=None):
        super().__init__(x, W, R, b, h0=h0, lengths=lengths)

    def _input_bias(self, bd):
        return bd[0]

    def _bias_gradient(self, dA, dAh):
        return backend.array_module(dA).stack((dA.sum(axis=0), dAh.sum(axis=0)))

    def _forward(self, projected, R, b, initial, xp):
        H = R.shape[0]
        h0 = initial[0]
        bh = b[1]
        N = projected.shape[0]
        # u_n = h_{t−1}·R_n + b_h,n: the recurrent share of the candidate, which r scales
        self.recurrent_share = recurrent_share = xp.empty((N, H), projected.dtype)
        outputs = xp.empty((N, H), projected.dtype)
        for t, s, n in self._steps():
            a = projected[s:s + n]                     # becomes [r z n] in place
            h = self._previous(outputs, h0, t, n)
            u = h @ R
            u += bh
            rz = a[:, :2 * H]
            rz += u[:, :2 * H]
            sigmoid_(rz)
            recurrent_share[s:s + n] = u[:, 2 * H:]
            candidate = a[:, 2 * H:]
            candidate += a[:, :H] * recurrent_share[s:s + n]
            tanh_(candidate)
            y = outputs[s:s + n]
            xp.subtract(h, candidate, out=y)
            y *= a[:, H:2 * H]
            y += candidate
        self.gate_values = projected
        return outputs

    def _bptt(self, G, R, carries, xp):
        H = R.shape[0]
        dh = carries[0]
        RT = R.T
        gate_values, recurrent_share, outputs = self.gate_values, self.recurrent_share, self.hidden
        h0 = self.initial[0]
        dA = xp.empty_like(gate_values)
        dU = xp.empty_like(gate_values)
        for t, s, n in self._steps(backward=True):
            step = gate_values[s:s + n]
            r, z, candidate = step[:, :H], step[:, H:2 * H], step[:, 2 * H:]
            dht = G[s:s + n]
            dht += dh[:n]
            da = dA[s:s + n]
            du = dU[s:s + n]
            dn = da[:, 2 * H:]
            xp.multiply(dht * (1 - z), 1 - candidate * candidate, out=dn)
            xp.multiply(dht * (self._previous(outputs, h0, t, n) - candidate), z * (1 - z),
                        out=da[:, H:2 * H])
            xp.multiply(dn * recurrent_share[s:s + n], r * (1 - r), out=da[:, :H])
            du[:, :2 * H] = da[:, :2 * H]
            xp.multiply(dn, r, out=du[:, 2 * H:])
            carry = du @ RT
            carry += dht * z
            dh[:n] = carry
        return dA, dU
