"""The built-in rules; importing this package registers them."""

from . import attention, batchnorm, block_scaled, gemm, norm, norm_backward, pointwise, reduction, rotary, weight_only

__all__ = [
    "attention",
    "batchnorm",
    "block_scaled",
    "gemm",
    "norm",
    "norm_backward",
    "pointwise",
    "reduction",
    "rotary",
    "weight_only",
]
