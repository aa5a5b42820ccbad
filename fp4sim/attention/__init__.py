"""Attention emulation: exact reference, recipes, probability converters, tiled forward/backward."""

__all__: list[str] = []
