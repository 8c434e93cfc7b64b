"""Sequence data: padding, lengths, bucketed minibatches, reproducible shuffles."""

__all__ = []
