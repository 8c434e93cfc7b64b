"""Convolution and pooling on NCHW data."""

__all__ = []
