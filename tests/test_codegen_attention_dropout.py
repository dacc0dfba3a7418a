"""Dropout inside the attention kernels: the mma.sync and decode forward kernels and both
backward paths (SIMT, mma.sync) run on the CPU (tests/cpu_emulation.py) against the reference,
whose mask they must draw bit for bit (a kernel with another mask misses by far more than the
tolerance: each case checks that). The SIMT forward kernel (warp shuffles the emulation lacks)
and the Hopper wgmma kernel compile here (the dropout cases of tests/attention_cases.py) and
run on a GPU (test_gpu_attention.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from codegen import emitter
from codegen.context import EmitContext
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.dtypes import DataType
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_backward_cases import BackwardCase
from tests.attention_cases import AttentionCase, PagedCase

pytestmark = pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")

# (case, tuning, kernel name part): fp16 takes mma.sync on sm_80, two query rows the decode kernel
FORWARD = {
    "flash_gqa_causal_padding_bshd": (
        AttentionCase(b=2, hq=4, hk=2, sq=19, skv=37, d=16, dv=24, data_type=DataType.HALF, dropout=0.5,
                      padding=True, layout="bshd", options={"use_causal_mask_bottom_right": True}),
        {},
        "_flash",
    ),
    "decode_split": (
        AttentionCase(b=2, hq=4, hk=2, sq=2, skv=37, d=16, dv=8, data_type=DataType.HALF, dropout=0.5),
        {"path": "decode", "split": 3},
        "_decode",
    ),
}  # fmt: skip

BACKWARD = BackwardCase(
    b=2, hq=2, hk=1, sq=19, skv=21, d=16, dv=16, data_type=DataType.HALF, forward=False, dropout=0.5,
    padding=True, options={"use_causal_mask_bottom_right": True},
)  # fmt: skip


def _undropped(graph, feeds, case):  # type: ignore[no-untyped-def]
    """The reference without dropout on the same inputs: what a kernel that ignored the mask gives."""
    plain = dataclasses.replace(case, dropout=None)
    ir = type(plain).build(plain).validate()
    return reference.execute(ir, {t.name: feeds[t.name] for t in ir.inputs})


def _check(graph, feeds, got, case) -> None:  # type: ignore[no-untyped-def]
    expected = reference.execute(graph, feeds)
    plain = _undropped(graph, feeds, case)
    for t in graph.outputs:
        want = expected[t.name].astype(np.float64)
        value = got[t.name].astype(np.float64)
        finite = np.isfinite(want)
        assert np.array_equal(finite, np.isfinite(value)), t.name
        error = relative_error(value[finite], want[finite])
        assert error <= tolerance(t.data_type), f"{t.name}: {error:.3g}"
        if t.name != "stats":  # STATS is the undropped softmax's; O and the gradients change
            assert relative_error(plain[t.name][finite].astype(np.float64), want[finite]) > 20 * tolerance(t.data_type)
        else:
            np.testing.assert_array_equal(plain[t.name], expected[t.name])


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_kernels_draw_the_reference_mask(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    case, tuning, path = FORWARD[name]
    graph = case.build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION]
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 80, tuning))
    assert path in program.kernels[0].name and "gd::bernoulli" in program.kernels[0].source
    feeds = random_inputs(graph, 5)
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    _check(graph, feeds, cpu_emulation.run(fused, program, feeds, 1, build), case)


def test_the_paged_decode_kernel_draws_the_dense_mask(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Key j of a paged sequence draws at its logical index, wherever its page lies in the pool."""
    paged = PagedCase(b=2, hq=4, hk=2, sq=2, max_len=40, page_size=8, d=16, dv=16, data_type=DataType.HALF,
                      dropout=0.5)  # fmt: skip
    graph = paged.build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION]
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 90, {"path": "decode", "split": 2}))
    feeds = paged.feeds(seed=4)
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    _check(graph, feeds, cpu_emulation.run(fused, program, feeds, 1, build), paged)


@pytest.mark.parametrize("path", ["simt", "mma"])
def test_backward_kernels_regenerate_the_forward_mask(path: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    graph = BACKWARD.build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION_BACKWARD]
    tuning = {"path": "simt"} if path == "simt" else {}
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 80, tuning))
    assert all(f"_{path}_" in k.name and "gd::bernoulli" in k.source for k in program.kernels[1:])
    feeds = BACKWARD.consistent_feeds(graph, 3)
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    _check(graph, feeds, cpu_emulation.run(fused, program, feeds, 1, build), BACKWARD)
