"""Convolution and matmul with their epilogues (a per-channel affine, bias, residual, activations)."""

from __future__ import annotations

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
