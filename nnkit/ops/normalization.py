"""Normalisation: BatchNorm, LayerNorm."""

__all__ = []
