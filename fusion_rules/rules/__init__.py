"""The built-in rules; importing this package registers them."""

from . import attention, batchnorm, gemm, norm, norm_backward, pointwise, reduction

__all__ = ["attention", "batchnorm", "gemm", "norm", "norm_backward", "pointwise", "reduction"]
