"""What the tests of several file formats share."""
import numpy as np


def with_one_bit_flipped(path, count, seed=0):
    """Overwrite the file at ``path`` ``count`` times, each time with the original content but
    one bit flipped, at ``count`` distinct byte positions drawn from ``seed``; yields after each
    write (a hostile-file test loads the file there)."""
    with open(path, "rb") as file:
        content = file.read()
    rng = np.random.default_rng(seed)
    for position in rng.choice(len(content), count, replace=False):
        flipped = bytearray(content)
        flipped[position] ^= 1 << int(rng.integers(8))
        with open(path, "wb") as file:
            file.write(flipped)
        yield
