import numpy as np
import pytest

import nnkit as nn


@pytest.mark.parametrize("cell,k", [("lstm", 4), ("gru", 3), ("rnn", 1)])
def test_vars_shapes_and_seeded_init(cell, k):
    model = nn.SequenceModel(7, 5, 3, cell=cell, embedding=4, seed=0)
    table, W, R, b, Wo, bo = model.vars
    assert table.shape == (7, 4) and W.shape == (4, k * 5) and R.shape == (5, k * 5)
    assert b.shape == ((2, 15) if cell == "gru" else (1, k * 5))
    assert Wo.shape == (5, 3) and bo.shape == (1, 3)
    again = nn.SequenceModel(7, 5, 3, cell=cell, embedding=4, seed=0)
    for p, q in zip(model.vars, again.vars):
        np.testing.assert_array_equal(p.data, q.data)
    other = nn.SequenceModel(7, 5, 3, cell=cell, embedding=4, seed=1)
    assert not np.array_equal(model.rnn.W.data, other.rnn.W.data)
    nn.seed(3)
    first = nn.SequenceModel(2, 5, 3, cell=cell).rnn.W.data
    nn.seed(3)
    np.testing.assert_array_equal(nn.SequenceModel(2, 5, 3, cell=cell).rnn.W.data, first)
    assert len(nn.SequenceModel(2, 5, 3, cell=cell).vars) == 5     # no table for features


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_the_model_is_made_of_layers_and_computes_what_they_compute(cell, rng):
    # SequenceModel drew its own weights and called the ops itself, beside nn.layers
    model = nn.SequenceModel(6, 4, 5, cell=cell, embedding=3, seed=0)
    layer = {"lstm": nn.layers.LSTM, "gru": nn.layers.GRU, "rnn": nn.layers.RNN}[cell]
    assert type(model.rnn) is layer and type(model.embedding) is nn.layers.Embedding
    assert type(model.head) is nn.layers.Linear
    tokens, lengths = rng.integers(0, 6, (5, 3)), np.array([5, 2, 4])
    by_hand = model.head(model.rnn(model.embedding(tokens), lengths=lengths))
    np.testing.assert_array_equal(model(tokens, lengths).data, by_hand.data)
    generator = np.random.default_rng(0)            # the layers drawn in turn from one seed
    again = [nn.layers.Embedding(6, 3, seed=generator), layer(3, 4, seed=generator),
             nn.layers.Linear(4, 5, seed=generator)]
    for p, q in zip(model.vars, [p for part in again for p in part.vars]):
        np.testing.assert_array_equal(p.data, q.data)


def test_the_parameters_named_before_layers_still_read_with_a_warning():
    model = nn.SequenceModel(6, 4, 5, embedding=3, seed=0)
    for old, new in [("table", model.embedding.table), ("W", model.rnn.W), ("R", model.rnn.R),
                     ("b", model.rnn.b), ("Wo", model.head.W), ("bo", model.head.b)]:
        with pytest.warns(DeprecationWarning, match=rf"SequenceModel.{old} is deprecated"):
            assert getattr(model, old) is new
    with pytest.warns(DeprecationWarning):
        assert nn.SequenceModel(2, 4, 5).table is None



def test_the_parameters_named_before_layers_are_still_assigned_with_a_warning(rng):
    # model.W = ... assigned the recurrent weights before the model was made of layers;
    # then it raised "property of 'SequenceModel' object has no setter"
    model = nn.SequenceModel(6, 4, 5, embedding=3, seed=0)
    tokens = rng.integers(0, 6, (5, 3))
    for old, layer, name in [("table", "embedding", "table"), ("W", "rnn", "W"),
                             ("R", "rnn", "R"), ("b", "rnn", "b"), ("Wo", "head", "W"),
                             ("bo", "head", "b")]:
        current = getattr(getattr(model, layer), name)
        replacement = nn.NetVar(current.data * 0.5)
        with pytest.warns(DeprecationWarning, match=rf"SequenceModel.{old} is deprecated: "
                                                    rf"the parameter is now model.{layer}"):
            setattr(model, old, replacement)
        assert getattr(getattr(model, layer), name) is replacement
        assert any(p is replacement for p in model.vars)
        assert not any(p is current for p in model.vars)
    by_hand = model.head(model.rnn(model.embedding(tokens)))
    np.testing.assert_array_equal(model(tokens).data, by_hand.data)
    plain = nn.SequenceModel(2, 4, 5)
    with pytest.warns(DeprecationWarning), \
            pytest.raises(AttributeError, match="SequenceModel.table: this model has no "
                                                "embedding"):
        plain.table = nn.NetVar(np.ones((2, 3)))
    assert plain.embedding is None and "table" not in vars(plain)

def test_lstm_forget_gate_bias_is_one():
    W, R, b = nn.recurrent_weights("lstm", 3, 4, seed=0)
    np.testing.assert_array_equal(b.data, np.r_[np.zeros(4), np.ones(4), np.zeros(8)][None])
    assert np.abs(W.data).max() <= 0.5 and W.shape == (3, 16) and R.shape == (4, 16)
    with pytest.raises(ValueError, match="recurrent_weights: cell must be one of"):
        nn.recurrent_weights("transformer", 3, 4)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_outputs_per_step_and_final(cell, rng, float64):
    lengths = np.array([3, 5, 1])
    tokens = rng.integers(0, 6, (5, 3))
    lm = nn.SequenceModel(6, 4, 6, cell=cell, embedding=3, seed=0)
    logits = lm(tokens, lengths)
    assert logits.shape == (5, 3, 6)
    loss = nn.SoftmaxCELoss(logits, tokens, lengths=lengths)
    loss.back()
    assert all(np.abs(p.g).max() > 0 for p in lm.vars)
    unused = np.setdiff1d(np.arange(6), tokens[np.arange(5)[:, None] < lengths])
    assert np.all(lm.embedding.table.g[unused] == 0)       # padding tokens got no gradient

    classifier = nn.SequenceModel(2, 4, 3, cell=cell, per_step=False, seed=0)
    x = rng.standard_normal((5, 3, 2))
    out = classifier(x, lengths)
    assert out.shape == (3, 3)
    np.testing.assert_allclose(out.data, classifier.recurrent.final.data
                               @ classifier.head.W.data + classifier.head.b.data)
    params = classifier.vars
    assert nn.gradcheck(lambda *p: classifier(x, lengths), *params)


def test_state_carries_between_chunks(rng):
    model = nn.SequenceModel(5, 4, 5, embedding=3, seed=0)
    tokens = rng.integers(0, 5, (8, 2))
    whole = model(tokens).data
    model(tokens[:5])
    state = tuple(s.detach() for s in model.final_state)
    assert len(state) == 2 and not state[0].requires_grad
    np.testing.assert_allclose(model(tokens[5:], state=state).data, whole[5:], atol=1e-5)


def test_training_learns_a_sequence_label(rng):
    # label: does the sequence contain token 1?  Needs the whole sequence.
    seqs = [rng.integers(2, 5, rng.integers(2, 9)) for _ in range(64)]
    for seq in seqs[::2]:
        seq[rng.integers(len(seq))] = 1
    labels = np.array([int(1 in s) for s in seqs])
    model = nn.SequenceModel(5, 8, 2, per_step=False, embedding=4, seed=0)
    optimizer = nn.Adam(model.vars, lr=0.05)
    losses = []
    for epoch in range(15):
        total = 0.0
        for x, lengths, t in nn.minibatches(seqs, labels, batch_size=16, seed=epoch):
            loss = nn.SoftmaxCELoss(model(x, lengths), t)
            loss.back()
            optimizer.step()
            total += loss.item()
        losses.append(total)
    assert losses[-1] < 0.3 * losses[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="SequenceModel: cell must be one of"):
        nn.SequenceModel(3, 4, 2, cell="elman")
    model = nn.SequenceModel(3, 4, 2, embedding=2)
    with pytest.raises(ValueError, match=r"SequenceModel: token ids must be \(T, B\)"):
        model(np.zeros((2, 3, 1), dtype=int))
    with pytest.raises(RuntimeError, match="call the model on a batch first"):
        nn.SequenceModel(3, 4, 2).final_state


def test_state_of_the_wrong_cell_type_or_shape_is_refused(rng):
    tokens = rng.integers(0, 5, (4, 3))
    gru = nn.SequenceModel(5, 4, 5, cell="gru", embedding=3, seed=0)
    lstm = nn.SequenceModel(5, 4, 5, cell="lstm", embedding=3, seed=0)
    lstm(tokens)
    h, c = (s.detach() for s in lstm.final_state)
    gru(tokens)
    last = gru.recurrent
    with pytest.raises(ValueError, match=r"SequenceModel\(cell='gru'\): state must be \(h,\) or "
                                         r"h, each of shape \(B, H\) = \(3, 4\) or \(1, 4\); got 2 "
                                         r"state\(s\) of shape\(s\) \(3, 4\), \(3, 4\)"):
        gru(tokens, state=(h, c))                       # an LSTM's state
    assert gru.recurrent is last                        # nothing changed
    # an LSTM given h only ran from c = 0 before, silently
    with pytest.raises(ValueError, match=r"SequenceModel\(cell='lstm'\): state must be \(h, c\), "
                                         r"each of shape \(B, H\) = \(3, 4\) or \(1, 4\); got 1 "
                                         r"state\(s\) of shape\(s\) \(3, 4\)"):
        lstm(tokens, state=(h,))
    with pytest.raises(TypeError, match=r"SequenceModel\(cell='lstm'\): state must be \(h, c\), "
                                        r".* got a single NetVar of shape \(3, 4\)"):
        lstm(tokens, state=h)
    with pytest.raises(ValueError, match=r"got 2 state\(s\) of shape\(s\) \(2, 4\), \(2, 4\)"):
        lstm(tokens, state=(h[:2], c[:2]))              # another batch size
    with pytest.raises(ValueError, match=r"got 1 state\(s\) of shape\(s\) \(3, 2\)"):
        gru(tokens, state=(np.zeros((3, 2)),))          # another hidden size
    with pytest.raises(TypeError, match=r"state must be \(h, c\).* got a tuple of NetVar, float"):
        lstm(tokens, state=(h, 0.0))
    with pytest.raises(TypeError, match="state must be .* got int 0"):
        gru(tokens, state=0)
    with pytest.raises(ValueError, match=r"got 0 state\(s\) of shape\(s\) none"):
        gru(tokens, state=())
    # a bare h for the GRU is its (h,), as in PyTorch; (1, H) broadcasts over the batch
    np.testing.assert_array_equal(gru(tokens, state=h).data, gru(tokens, state=[h]).data)
    assert lstm(tokens, state=(h[:1], c[:1])).shape == (4, 3, 5)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"outputs": 0}, ValueError, "outputs must be a positive integer, got 0"),
    ({"hidden": True}, TypeError, "hidden must be a positive integer, got bool True"),
    ({"inputs": 2.0}, TypeError, "inputs must be a positive integer, got float 2.0"),
    ({"embedding": 0}, ValueError, "embedding must be a positive integer, got 0"),
    ({"per_step": "no"}, TypeError, "per_step must be True or False, got str 'no'"),
    ({"cell": "lstm", "activation": "relu"}, ValueError, "activation is for cell='rnn'; an "
                                                         "'lstm' cell has its own"),
    ({"seed": 1.5}, TypeError, "seed must be None, an int or a numpy.random.Generator")])
def test_model_arguments(kwargs, error, message):
    with pytest.raises(error, match=f"SequenceModel: {message}"):
        nn.SequenceModel(**{"inputs": 3, "hidden": 4, "outputs": 2, **kwargs})


def test_features_must_be_time_major_3d():
    with pytest.raises(ValueError, match=r"SequenceModel: features must be \(T, B, F\), "
                                         r"time-major, got shape \(5, 3\)"):
        nn.SequenceModel(3, 4, 2)(np.zeros((5, 3)))


def test_recurrent_weights_arguments():
    with pytest.raises(TypeError, match="recurrent_weights: hidden must be a positive integer, "
                                        "got bool True"):
        nn.recurrent_weights("gru", 3, True)
    with pytest.raises(ValueError, match="recurrent_weights: forget_bias must be a finite "
                                         "number, got nan"):
        nn.recurrent_weights("lstm", 3, 4, forget_bias=float("nan"))
    with pytest.raises(TypeError, match="recurrent_weights: seed must be None, an int"):
        nn.recurrent_weights("lstm", 3, 4, seed="0")


def test_a_bad_rnn_activation_is_refused_before_any_draw_and_token_lists_are_read():
    # activation='foo' was taken (every weight drawn) and refused at the first call; a list of
    # token ids was read as shape ()
    nn.seed(0)
    expected = nn.glorot(2, 2).data
    nn.seed(0)
    with pytest.raises(ValueError, match=r"SequenceModel: activation must be one of \['linear', "
                                         r"'relu', 'sigmoid', 'tanh'\], got 'foo'"):
        nn.SequenceModel(5, 4, 5, cell="rnn", activation="foo")
    np.testing.assert_array_equal(nn.glorot(2, 2).data, expected)
    lm = nn.SequenceModel(5, 4, 5, embedding=3, seed=0)
    ids = [[1, 2], [3, 4]]
    np.testing.assert_array_equal(lm(ids).data, lm(np.array(ids)).data)


def test_features_of_another_size_are_refused_naming_the_model():
    # the error blamed the recurrent op's weight W, naming neither SequenceModel nor inputs
    model = nn.SequenceModel(3, 4, 2, cell="rnn", seed=0)
    with pytest.raises(ValueError, match=r"SequenceModel: features of shape \(5, 2, 4\) have "
                                         r"F = 4; this model takes F = 3 \(inputs=3\)"):
        model(np.ones((5, 2, 4)))
