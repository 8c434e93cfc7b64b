"""examples/transformer_classify.py: the quick command line runs, learns and prints its result."""
from tests.examples.helpers import reported_accuracy


def test_transformer_classify_quick_run_learns():
    # 600 sequences, 3 epochs, a few seconds: well above chance (0.5); the full run reaches
    # 1.0000 like the LSTM of sequence_classify.py (see the example's docstring)
    assert reported_accuracy("transformer_classify.py", "--quick") >= 0.75
