"""The built-in rules; importing this package registers them."""

from . import batchnorm, gemm, norm, pointwise

__all__ = ["batchnorm", "gemm", "norm", "pointwise"]
