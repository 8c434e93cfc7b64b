"""Sequence models: embedding -> recurrent op -> affine, in a few lines."""

__all__ = []
