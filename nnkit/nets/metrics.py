"""Metrics: accumulators weighted by minibatch size (and mask)."""

__all__ = []
