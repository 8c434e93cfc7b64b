"""Regularisation: Dropout, L2Reg."""

__all__ = []
