"""Dropout inside the attention kernels on the GPU, mask bit for bit: with Q = 0 the softmax is
uniform and V = I puts key j's weight in column j of O, so O's zeros are exactly the dropped
elements, which must be the reference's (rng's Philox draw), on every forward path; in the
backward, dO = I does the same for dVᵀ. Outputs are poisoned; values compare at the usual
tolerance (the mask is the same, so nothing else differs). test_gpu_attention.py and
test_gpu_attention_backward.py run the dropout cases of attention_cases.py on random inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.compare import tolerance
from graphdnn.dtypes import DataType
from graphdnn.ir import Graph
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from tests.attention_backward_cases import BackwardCase
from tests.attention_cases import AttentionCase
from tests.gpu_check import poisoned, relative_error, to_device, to_numpy

pytestmark = pytest.mark.gpu

SKV = 128  # V = I: Dv = Skv


def run(ir: Graph, feeds: dict[str, np.ndarray], tuning: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """The graph's outputs on the GPU (poisoned before the run), by name."""
    import torch

    (fused_name,) = [f.name for f in gd.fuse(ir).nodes if f.anchor is not None and f.anchor.op.startswith("sdpa")]
    plan = gd.compile(ir, **({"tuning": {fused_name: tuning}} if tuning else {}))
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    pack = {t.name: feeds[t.name] if t.is_pass_by_value else to_device(feeds[t.name], t) for t in ir.inputs}
    plan.execute({**pack, **outputs})
    torch.cuda.synchronize()
    return {name: to_numpy(value) for name, value in outputs.items()}


def check(ir: Graph, got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for t in ir.outputs:
        error = relative_error(got[t.name], expected[t.name].astype(np.float64))
        assert error <= tolerance(t.data_type), f"{t.name}: {error:.3g}"


def identity_feeds(ir: Graph, b: int, hk: int, data_type: DataType) -> dict[str, np.ndarray]:
    """Q = 0, random K, V = I (per batch and kv head), random seed and offset."""
    feeds = random_inputs(ir, 11)
    feeds["q"] = np.zeros_like(feeds["q"])
    feeds["v"] = np.broadcast_to(np.eye(SKV), (b, hk, SKV, SKV)).astype(data_type.numpy)
    return feeds


# (data type, tuning): the default (wgmma on sm_90, mma.sync on sm_80), an mma.sync choice, the
# decode kernel over many rows, the SIMT kernel (fp32)
PATHS = {
    "default": (DataType.BFLOAT16, None),
    "flash": (DataType.BFLOAT16, {"warps": 4, "block_n": 64, "m_tiles": 2}),
    "wgmma_pingpong": (DataType.BFLOAT16, {"path": "wgmma", "block_n": 64, "pingpong": True, "persistent": False}),
    "decode": (DataType.HALF, {"path": "decode", "split": 3}),
    "simt": (DataType.FLOAT, None),
}


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_forward_path_drops_the_reference_elements(path: str, p: float, causal: bool) -> None:
    data_type, tuning = PATHS[path]
    if path.startswith("wgmma") and current_gpu_arch() != 90:
        pytest.skip("the wgmma attention kernel runs on sm_90 GPUs only")
    options = {"use_causal_mask": True} if causal else {}
    case = AttentionCase(b=2, hq=4, hk=2, sq=100, skv=SKV, d=128, dv=SKV, data_type=data_type, dropout=p,
                         options=options)  # fmt: skip
    ir = case.build().validate()
    feeds = identity_feeds(ir, 2, 2, data_type)
    expected = reference.execute(ir, feeds)
    got = run(ir, feeds, tuning)
    kept = expected["o"] != 0
    assert abs(kept.mean() - (1 - p)) < 0.02 if not causal else 0 < kept.mean() < 1 - p
    np.testing.assert_array_equal(got["o"] != 0, kept)  # the same elements dropped, bit for bit
    check(ir, got, expected)


@pytest.mark.parametrize("path", ["mma", "simt"])
def test_the_backward_regenerates_the_forward_mask(path: str) -> None:
    """dV = (r Z P)ᵀ dO with P uniform (Q = 0) and dO = I: dV[b, h, j, i] is r Z[b, h, i, j] / Skv."""
    case = BackwardCase(b=2, hq=3, hk=3, sq=SKV, skv=SKV, d=64, dv=SKV, data_type=DataType.BFLOAT16, dropout=0.3,
                        forward=False)  # fmt: skip
    ir = case.build().validate()
    chosen = identity_feeds(ir, 2, 3, DataType.BFLOAT16)
    chosen["do"] = chosen["v"]  # Hq = Hk and Sq = Skv: I as well
    feeds = case.consistent_feeds(ir, 5, {n: chosen[n] for n in ("q", "v", "do", "seed", "offset")})
    expected = reference.execute(ir, feeds)
    got = run(ir, feeds, {"path": "simt"} if path == "simt" else None)
    mask = expected["dv"].swapaxes(-1, -2) != 0
    assert abs(mask.mean() - 0.7) < 0.02
    np.testing.assert_array_equal(got["dv"].swapaxes(-1, -2) != 0, mask)
    check(ir, got, expected)
