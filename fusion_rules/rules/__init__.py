"""The built-in rules; importing this package registers them."""

from . import batchnorm, gemm, norm, pointwise, reduction

__all__ = ["batchnorm", "gemm", "norm", "pointwise", "reduction"]
