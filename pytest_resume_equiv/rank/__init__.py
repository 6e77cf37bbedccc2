"""Code that runs inside torchrun ranks.

Nothing under this package imports pytest (ranks are plain training processes), and torch
is imported only when a tensor is actually recorded, so the in-rank API costs nothing in a
trainer that runs outside a test.
"""
