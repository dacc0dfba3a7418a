"""Attention backward graphs on awkward shapes, masks, layouts and types: compiled for sm_80 and
sm_90 on every machine (test_codegen_attention_backward.py), run on the CPU where the kernels
allow it, and against the reference on a GPU (test_gpu_attention_backward.py).

A case builds either a training step, ``sdpa`` then ``sdpa_backward`` on its O and STATS (the
GPU tests), or ``sdpa_backward`` alone, whose O and STATS inputs :func:`consistent_feeds`
computes with the forward reference (what the CPU emulation runs: no forward kernel).
The ragged cases are the forward's (attention_cases.RAGGED_CASES) through the backward.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

import graphdnn as gd
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.dtypes import DataType
from graphdnn.random_inputs import random_inputs
from tests import cpu_emulation
from tests.attention_cases import RAGGED_CASES as FORWARD_RAGGED_CASES
from tests.attention_cases import AttentionCase, RaggedCase


@dataclass(frozen=True)
class BackwardCase(AttentionCase):
    forward: bool = True  # the training step (sdpa then sdpa_backward), else the backward alone

    def build(self) -> gd.OperationGraphSpec:
        g = self.graph("attention_backward")
        q, k, v, extra = self.inputs(g)
        out_dims = [self.b, self.hq, self.sq, self.dv]
        if self.forward:
            o, stats = g.sdpa(q, k, v, generate_stats=True, name="attention", **extra, **self.options)
            assert stats is not None
        else:
            o = g.tensor(name="o", dim=out_dims, stride=self._strides(self.hq, self.sq, self.dv))
            stats = g.tensor(name="stats", dim=[self.b, self.hq, self.sq, 1], data_type=DataType.FLOAT)
        d_o = g.tensor(name="do", dim=out_dims, stride=self._strides(self.hq, self.sq, self.dv))
        grads = g.sdpa_backward(q, k, v, o, d_o, stats, name="attention_backward", **extra, **self.options)
        for name, grad in zip(("dq", "dk", "dv"), grads):
            grad.set_output(True).set_name(name)
        return g

    def consistent_feeds(
        self, ir: gd.Graph, seed: int, chosen: dict[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Random inputs of the backward-alone graph (``chosen`` ones replaced), with O and STATS
        the forward's of them."""
        feeds = random_inputs(ir, seed) | (chosen or {})
        forward = replace(self, stats=True, forward=True)
        forward_ir = AttentionCase.build(forward).validate()
        results = reference.execute(forward_ir, {t.name: feeds[t.name] for t in forward_ir.inputs})
        feeds["o"] = results["o"].astype(feeds["o"].dtype)
        feeds["stats"] = results["stats"].astype(np.float32)
        return feeds


CASES = {
    "one_row_one_key": BackwardCase(b=1, hq=1, hk=1, sq=1, skv=1),
    "mha_odd_lengths": BackwardCase(hq=2, hk=2, sq=7, skv=129),
    "gqa_4to1_causal": BackwardCase(hq=8, hk=2, sq=129, skv=129, options={"use_causal_mask": True}),
    "mqa_bottom_right_longer_kv": BackwardCase(
        hq=4, hk=1, sq=33, skv=300, options={"use_causal_mask_bottom_right": True}
    ),
    "bottom_right_longer_q_fp16": BackwardCase(
        sq=200, skv=70, data_type=DataType.HALF, options={"use_causal_mask_bottom_right": True}
    ),
    "sliding_window_causal": BackwardCase(
        sq=150, skv=150, options={"use_causal_mask": True, "sliding_window_length": 37}
    ),
    "sliding_window_alone": BackwardCase(sq=100, skv=150, options={"sliding_window_length": 16}),
    "alibi_causal_6_heads": BackwardCase(
        hq=6, hk=3, sq=90, skv=90, options={"use_causal_mask": True, "use_alibi_mask": True}
    ),
    "bias_per_key": BackwardCase(bias=(True, False, False, True)),
    "padding_with_empty_sequences": BackwardCase(b=4, sq=100, skv=90, padding=True),
    "padding_causal_bottom_right_fp16": BackwardCase(
        b=3, sq=64, skv=128, padding=True, data_type=DataType.HALF, options={"use_causal_mask_bottom_right": True}
    ),
    "d128_bshd": BackwardCase(hq=4, hk=4, sq=257, skv=300, d=128, dv=128, layout="bshd"),
    "d128_gqa_causal_fp16": BackwardCase(
        hq=8, hk=2, sq=255, skv=255, d=128, dv=128, data_type=DataType.HALF, options={"use_causal_mask": True}
    ),
    "d256_fp16": BackwardCase(b=1, hq=2, hk=1, sq=130, skv=200, d=256, dv=256, data_type=DataType.HALF),
    "d72_dv40": BackwardCase(d=72, dv=40),
    "d64_dv128_runtime_scale": BackwardCase(d=64, dv=128, sq=65, skv=99, scale="runtime"),
    "no_scale": BackwardCase(scale="none", sq=40, skv=40, d=32, dv=32),
    "fp32_simt": BackwardCase(data_type=DataType.FLOAT, sq=70, skv=45, d=40, dv=24),
    "mixed_types_simt": BackwardCase(kv_type=DataType.HALF, sq=33, skv=65, options={"use_causal_mask": True}),
    "dropout_gqa_causal": BackwardCase(hq=8, hk=2, sq=129, skv=129, dropout=0.1, options={"use_causal_mask": True}),
    "dropout_fp32_simt": BackwardCase(data_type=DataType.FLOAT, sq=70, skv=45, d=40, dv=24, dropout=0.5),
}

# The Hopper kernels' cases (attention_backward_wgmma.py takes fp16/bf16 at D = Dv = 64 or 128
# with no mask or a causal one): CASES' that it takes, and lengths across several key blocks and
# query tiles, a single row, 32 query heads on one kv head.
WGMMA_CASES = {
    name: CASES[name]
    for name in (
        "one_row_one_key", "mha_odd_lengths", "gqa_4to1_causal", "mqa_bottom_right_longer_kv",
        "bottom_right_longer_q_fp16", "d128_bshd", "d128_gqa_causal_fp16",
    )
} | {
    "d128_causal_1000": BackwardCase(b=1, hq=2, hk=1, sq=1000, skv=1000, d=128, dv=128, options={"use_causal_mask": True}),
    "one_row_1000_keys": BackwardCase(b=2, hq=2, hk=2, sq=1, skv=1000),
    "d128_fp16_7_keys_bottom_right": BackwardCase(
        b=1, hq=4, hk=4, sq=300, skv=7, d=128, dv=128, data_type=DataType.HALF,
        options={"use_causal_mask_bottom_right": True},
    ),
    "mqa_32_to_1_causal": BackwardCase(b=1, hq=32, hk=1, sq=129, skv=257, options={"use_causal_mask": True}),
}  # fmt: skip

# The backward alone on the wgmma path: O and dO in the 16-bit type (the training step's O is
# the forward's fp32), so that the preprocess kernel reads them 16 bytes at a time.
WGMMA_ALONE_CASES = {
    "d64_half_alone_causal": BackwardCase(
        b=2, hq=4, hk=2, sq=130, skv=200, data_type=DataType.HALF, forward=False, options={"use_causal_mask": True}
    ),
    "d128_bf16_alone_bshd": BackwardCase(b=1, hq=2, hk=2, sq=77, skv=140, d=128, dv=128, forward=False, layout="bshd"),
}  # fmt: skip

# Small cases the CPU emulation runs (float and half only: it has no bf16), backward alone; the
# half ones on the tensor-core kernels too.
CPU_CASES = {
    "float_gqa_causal": BackwardCase(
        b=1, hq=4, hk=2, sq=19, skv=21, d=8, dv=12, data_type=DataType.FLOAT, forward=False,
        options={"use_causal_mask": True},
    ),
    "float_bottom_right_window_alibi": BackwardCase(
        b=2, hq=2, hk=1, sq=9, skv=23, d=16, dv=8, data_type=DataType.FLOAT, forward=False,
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 5, "use_alibi_mask": True},
    ),
    "half_padding_bias_bshd": BackwardCase(
        b=3, hq=2, hk=2, sq=17, skv=13, d=8, dv=8, data_type=DataType.HALF, forward=False, padding=True,
        bias=(True, True, False, True), layout="bshd", scale="runtime",
    ),
    "float_window_alone_mqa": BackwardCase(
        b=1, hq=3, hk=1, sq=20, skv=18, d=24, dv=4, data_type=DataType.FLOAT, forward=False,
        options={"sliding_window_length": 4},
    ),
    "half_gqa_causal_d16_dv32": BackwardCase(
        b=1, hq=2, hk=1, sq=19, skv=37, d=16, dv=32, data_type=DataType.HALF, forward=False,
        options={"use_causal_mask": True},
    ),
    "half_bottom_right_window_alibi_bshd": BackwardCase(
        b=1, hq=1, hk=1, sq=70, skv=66, d=24, dv=8, data_type=DataType.HALF, forward=False, layout="bshd",
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 20, "use_alibi_mask": True},
    ),
    "float_d160_small_tiles": BackwardCase(
        b=1, hq=1, hk=1, sq=10, skv=11, d=160, dv=100, data_type=DataType.FLOAT, forward=False,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class RaggedBackwardCase(RaggedCase):
    """Packed sequences through ``sdpa_backward``: the training step (the GPU tests) or the
    backward alone, O and STATS from the forward reference (packed like Q; the CPU runs)."""

    forward: bool = True

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(
            name="ragged_attention_backward", io_data_type=self.data_type, compute_data_type=DataType.FLOAT
        )
        q, k, v, extra = self.inputs(g)
        tq = self.tokens(self.lengths_q)
        if self.forward:
            o, stats = g.sdpa(q, k, v, generate_stats=True, name="attention", **extra)
            assert stats is not None
        else:
            o = self.packed(g, "o", self.hq, tq, self.dv)
            stats = g.tensor(name="stats", dim=[1, self.hq, tq, 1], data_type=DataType.FLOAT)
        d_o = self.packed(g, "do", self.hq, tq, self.dv)
        grads = g.sdpa_backward(q, k, v, o, d_o, stats, name="attention_backward", **extra)
        for name, grad in zip(("dq", "dk", "dv"), grads):
            grad.set_output(True).set_name(name)
        return g

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        """The forward's inputs and dO; O and STATS too for the backward alone (the forward's)."""
        feeds = RaggedCase.feeds(self, seed)
        rng = np.random.default_rng(seed + 1)
        feeds["do"] = rng.standard_normal((1, self.hq, self.tokens(self.lengths_q), self.dv)).astype(feeds["q"].dtype)
        if not self.forward:
            forward = RaggedCase.build(replace(self, stats=True)).validate()
            results = reference.execute(forward, {t.name: feeds[t.name] for t in forward.inputs})
            feeds["o"] = results["o"].astype(feeds["q"].dtype)
            feeds["stats"] = results["stats"].astype(np.float32)
        return feeds


RAGGED_CASES = {
    name: RaggedBackwardCase(**{f.name: getattr(case, f.name) for f in fields(RaggedCase)})
    for name, case in FORWARD_RAGGED_CASES.items()
}
RAGGED_CASES["padded_kv_fp16_dropout"] = RaggedBackwardCase(
    packed_kv=False, data_type=DataType.HALF, d=32, dv=48, options={"use_causal_mask": True, "dropout": (0.2, 7, 3)}
)

# Small ragged cases the CPU emulation runs (backward alone): float on the SIMT kernels, half on
# both; sequences of no rows, rows cut by max_seq_len_q, spare tokens, padded K and V.
RAGGED_CPU_CASES = {
    "float_packed_causal_gqa": RaggedBackwardCase(
        lengths_q=(5, 0, 19), lengths_kv=(7, 3, 17), hq=4, hk=2, d=8, dv=12, data_type=DataType.FLOAT, forward=False,
    ),
    "half_packed_window_max_rows": RaggedBackwardCase(
        lengths_q=(9, 21, 1), lengths_kv=(11, 20, 6), hq=2, hk=1, d=16, dv=16, data_type=DataType.HALF, forward=False,
        options={"use_causal_mask": True, "sliding_window_length": 6, "max_seq_len_q": 12},
    ),
    "half_padded_kv": RaggedBackwardCase(
        lengths_q=(13, 0, 4), lengths_kv=(9, 5, 30), hq=2, hk=2, d=16, dv=8, data_type=DataType.HALF, forward=False,
        packed_kv=False, options={},
    ),
}  # fmt: skip


def cpu_runs(names: Iterable[str]) -> list[tuple[str, str, int]]:
    """(case, path, aligned): every CPU case on the SIMT kernels; the half ones on the mma.sync
    kernels too, with 16-byte copies and element by element."""
    names = sorted(names)
    return [(name, "simt", 1) for name in names] + [
        (name, "mma", aligned) for name in names if name.startswith("half") for aligned in (1, 0)
    ]


def matches_on_the_cpu(
    graph: gd.Graph, fused: Any, program: Any, feeds: dict[str, np.ndarray], aligned: int, temporary: Any
) -> None:
    """The program's kernels on the CPU emulation (outputs and scratch poisoned with NaN; built
    under pytest's ``temporary`` path factory) give the reference's gradients, which are not all
    zero (the case has gradients to get wrong)."""
    build: Path = temporary.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    expected = reference.execute(graph, feeds)
    got = cpu_emulation.run(fused, program, feeds, aligned, build)
    for t in graph.outputs:
        error = relative_error(got[t.name].astype(np.float64), expected[t.name])
        assert error <= tolerance(t.data_type), f"{t.name}: {error:.3g}"
        assert np.abs(expected[t.name]).max() > 0
