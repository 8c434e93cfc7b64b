"""A character-level LSTM language model trained with truncated backpropagation through time.

    python examples/char_rnn.py             # the full run
    python examples/char_rnn.py --quick     # a small model for a few epochs (a smoke test)

The text (``examples/data/sonnets.txt``, or ``--text FILE``) is cut into ``--batch`` parallel
streams, and each epoch walks them in chunks of ``--steps`` characters. The LSTM's final state
after one chunk is carried into the next one as a constant (``.detach()``): the model reads
each stream from its start, while gradients stop at chunk boundaries (truncated BPTT). Prints
the mean loss per epoch (with a tqdm progress bar when tqdm is installed) and samples text at
the end.
"""
import argparse
import pathlib

import numpy as np

import nnkit as nn

try:
    from tqdm import tqdm
except ImportError:          # progress bars are optional
    tqdm = None

TEXT = pathlib.Path(__file__).resolve().parent / "data" / "sonnets.txt"


def streams(ids, batch, steps):
    """(chunks, T, B) inputs and next-character targets: ``batch`` streams side by side."""
    per_stream = (len(ids) - 1) // batch // steps * steps
    if per_stream == 0:
        raise SystemExit(f"char_rnn: the text is too short for {batch} streams of {steps} steps")
    x = ids[:batch * per_stream].reshape(batch, per_stream).T            # (time, B)
    t = ids[1:batch * per_stream + 1].reshape(batch, per_stream).T
    return x.reshape(-1, steps, batch), t.reshape(-1, steps, batch)


def sample(model, vocab, prompt, length, rng, temperature=0.8):
    """Continue ``prompt`` one character at a time, carrying the state between steps."""
    index = {c: i for i, c in enumerate(vocab)}
    with nn.no_grad():
        logits = model(np.array([[index[c]] for c in prompt]))
        out = []
        for _ in range(length):
            z = logits.data[-1, 0] / temperature
            p = np.exp(z - z.max())
            next_id = int(rng.choice(len(vocab), p=p / p.sum()))
            out.append(vocab[next_id])
            logits = model(np.array([[next_id]]), state=model.final_state)
    return prompt + "".join(out)


def main(epochs=60, hidden=128, embedding=32, batch=8, steps=48, lr=0.005, text=TEXT,
         sample_length=300, seed=0, progress=True):
    nn.seed(seed)
    corpus = pathlib.Path(text).read_text(encoding="utf-8")
    vocab = sorted(set(corpus))
    ids = np.array([vocab.index(c) for c in corpus])
    inputs, targets = streams(ids, batch, steps)
    model = nn.SequenceModel(len(vocab), hidden, len(vocab), cell="lstm", embedding=embedding)
    optimizer = nn.Adam(model.vars, lr=lr, modifiers=[nn.ClipGradNorm(5.0)])
    losses = []
    for epoch in range(epochs):
        bar = tqdm(total=len(inputs), desc=f"epoch {epoch + 1}", leave=False) \
            if progress and tqdm is not None else None
        state, total = None, 0.0
        for x, t in zip(inputs, targets):
            logits = model(x, state=state)                   # (steps, batch, vocabulary)
            loss = nn.SoftmaxCELoss(logits, t)
            loss.back()
            optimizer.step()
            state = tuple(s.detach() for s in model.final_state)  # carried on, gradients cut here
            total += loss.item()
            if bar is not None:
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
        if bar is not None:
            bar.close()
        losses.append(total / len(inputs))
        print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}")
    text_out = sample(model, vocab, corpus[:6], sample_length, np.random.default_rng(seed))
    print("sample:")
    print(text_out)
    return losses, text_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small model for a few epochs (seconds)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--text", default=str(TEXT), help="a UTF-8 text file to learn")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    options = dict(epochs=5, hidden=32, embedding=16, sample_length=80) if args.quick else {}
    if args.epochs is not None:
        options["epochs"] = args.epochs
    if args.hidden is not None:
        options["hidden"] = args.hidden
    main(text=args.text, seed=args.seed, **options)
