"""Convolution (forward and gradients) and matmul with their epilogues (a per-channel affine,
bias, residual, activations)."""

from __future__ import annotations

from ..conv_grad_gemm import tensor_core_conv_grad
from ..guards import FUSED_GUARDS, per_channel_operand
from ..partition import Family
from ..pattern import Epilogue, Pattern, op
from ..rule import Rule, register_rule

CONV_BN_ACT = register_rule(
    Rule(
        name="conv_bn_act",
        pattern=Pattern(
            (
                op("conv_fprop", bind="conv", where=FUSED_GUARDS),
                op(
                    "bias",
                    "add",
                    bind="bias",
                    via=["input", "a", "b"],
                    optional=True,
                    where=(*FUSED_GUARDS, per_channel_operand("conv")),
                ),
                op("batchnorm_inference", bind="bn", via=["input"], where=FUSED_GUARDS),
                Epilogue(guards=FUSED_GUARDS),
            )
        ),
        family=Family.GEMM,
        anchor="conv",
        priority=10,
        description=(
            "conv_fprop [+ per-channel bias] + batchnorm_inference, then any elementwise epilogue: "
            "the kernel folds the batch norm into a per-channel scale = gamma * inv_variance and "
            "shift = beta - mean * scale, computed from the runtime tensors, applied to the accumulator"
        ),
    )
)

CONV_EPILOGUE = register_rule(
    Rule(
        name="conv_epilogue",
        pattern=Pattern(
            (op("conv_fprop", bind="conv", where=FUSED_GUARDS), Epilogue(min_nodes=1, guards=FUSED_GUARDS))
        ),
        family=Family.GEMM,
        anchor="conv",
        priority=40,
        description="conv_fprop followed by elementwise ops (bias, residual add, activations) applied to the accumulator",
    )
)

MATMUL_EPILOGUE = register_rule(
    Rule(
        name="matmul_epilogue",
        pattern=Pattern((op("matmul", bind="matmul", where=FUSED_GUARDS), Epilogue(min_nodes=1, guards=FUSED_GUARDS))),
        family=Family.GEMM,
        anchor="matmul",
        priority=41,
        description="matmul followed by elementwise ops (bias, residual add, activations) applied to the accumulator",
    )
)

CONV_DGRAD_GEMM = register_rule(
    Rule(
        name="conv_dgrad_gemm",
        pattern=Pattern(
            (
                op("conv_dgrad", bind="dgrad", where=(*FUSED_GUARDS, tensor_core_conv_grad)),
                Epilogue(guards=FUSED_GUARDS),
            )
        ),
        family=Family.GEMM,
        anchor="dgrad",
        priority=42,
        description=(
            "conv_dgrad as a tensor-core implicit GEMM (fusion_rules/conv_grad_gemm.py says which "
            "layouts fit), with any elementwise epilogue on dx (drelu-style masks, residual add); "
            "the others stay on the direct kernel"
        ),
    )
)

CONV_WGRAD_GEMM = register_rule(
    Rule(
        name="conv_wgrad_gemm",
        pattern=Pattern((op("conv_wgrad", bind="wgrad", where=(*FUSED_GUARDS, tensor_core_conv_grad)),)),
        family=Family.GEMM,
        anchor="wgrad",
        priority=43,
        description=(
            "conv_wgrad as a tensor-core GEMM (dw = dy^T x, reduced over N*P*Q with split-K) when "
            "the layouts fit (fusion_rules/conv_grad_gemm.py); the others stay on the direct kernel"
        ),
    )
)
