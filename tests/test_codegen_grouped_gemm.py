"""The tensor-core grouped GEMM (``moe_grouped_matmul``, codegen/families/gemm_grouped.py and,
on sm_90, gemm_grouped_ws.py).

CPU: every case and tile compiles with NVRTC for sm_80 and sm_90 (wgmma and engine tiles for
sm_90a); the path choice (the engine on sm_90, mma.sync elsewhere, or the SIMT kernel with the
reason on the log), the tuning candidates and errors, which name the node. GPU (``gpu``):
results against the reference with poisoned outputs, for crafted offsets: experts without
rows, all rows to one expert, rows before every offset (zero), falling offsets, offsets out of
[0, S]; K and N not multiples of any tile, a single row, 8 and 64 experts, both weight
layouts, fp16 and bf16, more tiles than SMs, every tile of every path.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from codegen import compile_cubin
from codegen.emit import emit_partition
from codegen.families.direct import candidates
from codegen.families.gemm_grouped import expected_row_tiles, grouped_problem
from codegen.families.gemm_grouped_block import row_tiles
from codegen.families.gemm_mma import TILE_CANDIDATES
from codegen.families.gemm_sm90 import TILES as WGMMA_TILES
from codegen.families.gemm_ws import BLOCK_NS as WS_BLOCK_NS
from codegen.families.gemm_ws import tiles as ws_tiles_of
from fusion_rules import fuse
from graphdnn import reference
from graphdnn.compare import tolerance
from graphdnn.compilation import Compilation
from graphdnn.errors import UnsupportedError
from graphdnn.lower import KernelSource, lower
from graphdnn.random_inputs import random_inputs
from tests.gpu_check import poisoned, relative_error, to_device, to_numpy

NODE = "experts"
WGMMA_128X256 = {"path": "wgmma", "block_m": 128, "block_n": 256, "stages": 4}


def grouped(
    rows: int,
    k: int,
    n: int,
    experts: int,
    io: str = "bfloat16",
    k_major: bool = False,
    offsets: str = "int32",
    compute: str = "float",
    frontend_form: bool = False,
) -> gd.OperationGraphSpec:
    """output [rows, n] = moe_grouped_matmul(token [rows, k], weight [experts, k, n], offsets);
    ``k_major``: the weight stored [experts, n, k] (seen as [experts, k, n]); ``frontend_form``:
    token [1, rows, k], offsets [experts, 1, 1] and output [1, rows, n], as the cuDNN frontend has them."""
    g = gd.OperationGraphSpec(io_data_type=io, intermediate_data_type="float", compute_data_type=compute)
    stride = [n * k, 1, k] if k_major else [k * n, n, 1]
    weight = g.tensor([experts, k, n], name="weight", stride=stride)
    unit = [1] if frontend_form else []
    first = g.tensor([experts, *unit, *unit], name="offsets", data_type=offsets)
    y = g.moe_grouped_matmul(g.tensor([*unit, rows, k], name="token"), weight, first, name=NODE)
    y.set_name("out").set_output(True)
    return g


# (rows, k, n, experts, io, k_major): K and N not multiples of any tile, one row, 64 experts.
CASES: dict[str, tuple[int, int, int, int, str, bool]] = {
    "ragged_k_n_8_experts": (300, 72, 88, 8, "bfloat16", False),
    "one_row_8_experts": (1, 40, 24, 8, "half", False),
    "64_experts_fp16": (1000, 136, 200, 64, "half", False),
    "k_major_weight": (257, 264, 72, 8, "bfloat16", True),
    "many_rows_per_expert": (4100, 128, 136, 4, "bfloat16", False),  # 128-row default tiles
    "more_tiles_than_sms": (20000, 64, 264, 16, "bfloat16", False),  # each persistent block walks several
}


def sources(g: gd.OperationGraphSpec, arch: int, tuning: Mapping[str, Any] | None = None) -> list[KernelSource]:
    job = Compilation.of(g.validate(), arch)
    positions = None if tuning is None else {0: tuning}
    return list(
        lower(job.partition, job.target, job.signature, job.fields.kernel_key, tuning=positions).sources.values()
    )


def ws_tiles() -> list[dict[str, object]]:
    """The engine's tiles: 128 x 128 and 128 x 256, each with the deepest ring and one stage less."""
    return [dict(c) for bn in WS_BLOCK_NS for c in ws_tiles_of(bn)]


# -- CPU ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(CASES))
def test_default_kernel_is_the_tensor_core_one_and_compiles(name: str, arch: int) -> None:
    """sm_90: the engine (TMA maps, persistent units over the offsets' tiles); sm_80: mma.sync."""
    (source,) = sources(grouped(*CASES[name]), arch)
    assert ("_grouped_ws" if arch == 90 else "_grouped_mma") in source.name and "grouped_tile<" in source.source
    assert compile_cubin(source.source, source.name, arch, source.arch_suffix)


@pytest.mark.parametrize(
    ("rows", "experts", "block_n"),
    [(8192, 8, 128), (8192, 64, 256), (65536, 8, 256), (65536, 64, 256), (512, 8, 128)],
)
def test_sm_90_defaults_to_the_engine_tile_whose_waves_take_less_time(rows: int, experts: int, block_n: int) -> None:
    """gemm_grouped.ws_choice, N = 1408 on 132 SMs: 8192 rows over 8 experts make 68 row tiles,
    3.1 waves of 128 x 256 tiles (4 x 1.55 = 6.2 narrow ones) against 5.7 of 128 x 128 (6): the
    narrow tile; over 64 experts 96 row tiles, 4.4 waves (7.75) against 8.0: the wide one."""
    (default,) = sources(grouped(rows, 64, 1408, experts), 90)
    assert "_grouped_ws" in default.name and f"BN = {block_n}," in default.source and default.arch_suffix == "a"
    assert expected_row_tiles(grouped_problem(default_node(rows, experts))) == rows // 128 + experts // 2
    (ampere,) = sources(grouped(rows, 64, 1408, experts), 80)
    assert "_grouped_mma" in ampere.name


def default_node(rows: int, experts: int) -> Any:
    ir = grouped(rows, 64, 1408, experts).validate()
    return next(n for n in ir.nodes if n.op == "moe_grouped_matmul")


def test_the_engine_reads_static_maps_and_walks_the_offsets_tiles() -> None:
    """A's map over all S rows (2-d, also for the frontend's [1, S, K]), B's over [E, K, N] (the
    tile's expert its outer coordinate); the producer finds each unit's tile and tells the
    consumers in the unit's first stage; rows past the group's end are not stored (the
    epilogue's bound GM is the group's end)."""
    for g in (grouped(*CASES["ragged_k_n_8_experts"]), grouped(*FRONTEND_FORM, frontend_form=True)):
        (source,) = sources(g, 90)
        assert "grouped_tile<8, BM, 1>" in source.source and "unit / TILES_N" in source.source
        assert "tma_load(a_tiles + stage * A_STAGE, &tm0, bar, kt * BK, (int)m0);" in source.source
        assert "kt * BK, expert);" in source.source or "n0, expert);" in source.source
        assert source.source.count("grouped_tile<") == 1  # the producer's call, the consumers' none
        assert "GM = (int)slot[2]" in source.source and "if (m >= GM) continue;" in source.source
    (one,) = sources(grouped(300, 72, 88, 1), 90)
    assert "expert);" not in one.source  # one expert: B's map is 2-d


@pytest.mark.parametrize("tile", ws_tiles(), ids=lambda t: f"{t['block_n']}x{t['stages']}")
@pytest.mark.parametrize("name", ["ragged_k_n_8_experts", "k_major_weight", "64_experts_fp16"])
def test_every_engine_tile_compiles_for_sm_90a(name: str, tile: dict[str, object]) -> None:
    (source,) = sources(grouped(*CASES[name]), 90, {"path": "ws", **tile})
    assert "_grouped_ws" in source.name and f"BN = {tile['block_n']}," in source.source
    assert compile_cubin(source.source, source.name, 90, source.arch_suffix)


def test_the_candidates_are_every_tensor_core_tile() -> None:
    g = grouped(*CASES["ragged_k_n_8_experts"])
    partition = fuse(g.validate(), arch=90)
    (fused,) = [f for f in partition.nodes if f.anchor is not None and f.anchor.op == "moe_grouped_matmul"]
    on_90, on_80 = candidates(fused, 90), candidates(fused, 80)
    assert [c for c in on_90 if c["path"] == "ws"] == [{"path": "ws", **t} for t in ws_tiles()]
    assert {c["path"] for c in on_90} == {"mma", "wgmma", "ws"} and {c["path"] for c in on_80} == {"mma"}
    partition = fuse(grouped(64, 32, 32, 4, io="float").validate(), arch=90)
    (fp32,) = [f for f in partition.nodes if f.anchor is not None and f.anchor.op == "moe_grouped_matmul"]
    assert candidates(fp32, 90) == []


def test_the_block_state_is_in_dynamic_shared_memory() -> None:
    """A 64x128 mma.sync tile uses exactly 48 KiB: a static __shared__ array beside it failed to
    launch on the GPU (the launch opts in beyond 48 KiB for the dynamic bytes only)."""
    (program,) = emit_partition(fuse(grouped(*CASES["ragged_k_n_8_experts"]).validate(), arch=80), 80)
    (kernel,) = program.kernels
    assert "BM = 64, BN = 128" in kernel.source and kernel.shared_bytes == 48 * 1024 + 32
    assert kernel.source.count("__shared__") == 1 and "reinterpret_cast<long long*>(smem + 49152)" in kernel.source


@pytest.mark.parametrize("tile", TILE_CANDIDATES, ids=lambda t: f"{t.block_m}x{t.block_n}x{t.stages}")
def test_every_mma_tile_compiles_for_sm_80(tile: Any) -> None:
    choice = {"path": "mma", "block_m": tile.block_m, "block_n": tile.block_n, "stages": tile.stages}
    (source,) = sources(grouped(*CASES["64_experts_fp16"]), 80, choice)
    assert f"BM = {tile.block_m}, BN = {tile.block_n}" in source.source
    assert compile_cubin(source.source, source.name, 80, source.arch_suffix)


@pytest.mark.parametrize("tile", WGMMA_TILES, ids=lambda t: "x".join(map(str, t)))
def test_every_wgmma_tile_compiles_for_sm_90a(tile: tuple[int, int, int]) -> None:
    choice = {"path": "wgmma", "block_m": tile[0], "block_n": tile[1], "stages": tile[2]}
    (source,) = sources(grouped(*CASES["ragged_k_n_8_experts"]), 90, choice)
    assert "_grouped_wgmma" in source.name and source.arch_suffix == "a"
    assert compile_cubin(source.source, source.name, 90, source.arch_suffix)


def test_the_grid_covers_every_tiling_of_the_rows() -> None:
    """row_tiles bounds sum over groups of ceil(rows / BM) for every split of S rows into
    E + 1 groups (the experts and the rows before every offset)."""
    rng = np.random.default_rng(0)
    for rows, experts, block_m in [(1, 8, 64), (300, 8, 64), (1000, 64, 128), (64, 64, 64)]:
        for _ in range(200):
            cuts = np.sort(rng.integers(0, rows + 1, experts))
            sizes = np.diff(np.concatenate([[0], cuts, [rows]]))
            assert int(np.sum(-(-sizes // block_m))) <= row_tiles(rows, experts, block_m)


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (grouped(64, 32, 32, 4, io="float"), "multiplies float by float"),
        (grouped(64, 20, 32, 4), "not in 16-byte chunks"),  # K % 8
        (grouped(64, 32, 20, 4), "not in 16-byte chunks"),  # N % 8 with an N-contiguous weight
        (grouped(64, 32, 32, 4, compute="double"), "asks for double compute"),
    ],
    ids=["fp32", "k_20", "n_20", "double_compute"],
)
def test_what_the_tensor_cores_cannot_take_runs_on_simt_with_the_reason_logged(
    graph: gd.OperationGraphSpec, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="graphdnn.compile"):
        (source,) = sources(graph, 90)
    assert "grouped_tile<" not in source.source and "moe_grouped_matmul" in source.name
    assert any(reason in record.getMessage() and NODE in record.getMessage() for record in caplog.records)
    assert compile_cubin(source.source, source.name, 90, source.arch_suffix)


def test_sm_75_and_a_simt_tuning_take_the_simt_kernel() -> None:
    (simt,) = sources(grouped(*CASES["ragged_k_n_8_experts"]), 90, {"path": "simt"})
    assert "grouped_tile<" not in simt.source
    (old,) = sources(grouped(*CASES["ragged_k_n_8_experts"]), 75)
    assert "grouped_tile<" not in old.source


@pytest.mark.parametrize(
    ("arch", "choice", "message"),
    [
        (90, {"path": "cutlass"}, "path must be one of simt, mma, wgmma, ws"),
        (90, {"path": "mma", "block_m": 32, "block_n": 64, "stages": 4}, "the mma.sync tiles are"),
        (80, {"path": "wgmma", "block_m": 128, "block_n": 128, "stages": 3}, "wgmma needs sm_90"),
        (80, {"path": "ws", "block_n": 128, "stages": 4}, "the warp-specialised engine takes"),
        (90, {"path": "ws", "block_n": 128, "stages": 4, "split_k": 2}, "the warp-specialised engine takes"),
        (90, {"path": "ws", "block_n": 64, "stages": 4}, "expected block_n in"),
        (90, {"path": "ws", "block_n": 256, "stages": 5}, "shared memory"),
    ],
)
def test_bad_tunings_name_the_node(arch: int, choice: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedError, match=message) as error:
        sources(grouped(*CASES["ragged_k_n_8_experts"]), arch, choice)
    assert NODE in str(error.value)


def test_a_tensor_core_tuning_of_fp32_operands_says_why_not() -> None:
    with pytest.raises(UnsupportedError, match="multiplies float by float") as error:
        sources(grouped(64, 32, 32, 4, io="float"), 90, {"path": "mma", "block_m": 64, "block_n": 64, "stages": 4})
    assert NODE in str(error.value)


# -- GPU ------------------------------------------------------------------------------------------
def rising_offsets(rows: int, experts: int, seed: int) -> np.ndarray:
    """Random expert sizes (some zero): rising offsets from 0."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[0], np.sort(rng.integers(0, rows + 1, experts - 1))]).astype(np.int32)


def run(g: gd.OperationGraphSpec, offsets: np.ndarray, tuning: Mapping[str, Any] | None = None) -> None:
    """The plan's output against the reference, from a poisoned buffer; the rows no expert holds
    exactly zero."""
    import torch

    ir = g.validate()
    feeds = random_inputs(ir, seed=3)
    feeds["offsets"] = offsets.astype(feeds["offsets"].dtype).reshape(feeds["offsets"].shape)
    want = reference.execute(ir, feeds)["out"].astype(np.float64)
    plan = gd.compile(ir, tuning=None if tuning is None else {NODE: dict(tuning)})
    out = poisoned(ir.outputs[0])
    plan.execute({**{t.name: to_device(feeds[t.name], t) for t in ir.inputs}, "out": out})
    torch.cuda.synchronize()
    got = to_numpy(out)
    error = relative_error(got, want)
    assert error <= tolerance(ir.outputs[0].data_type), f"relative error {error:.3g}"
    got = got.reshape(-1, got.shape[-1])
    unheld = np.arange(got.shape[0]) < min(max(int(offsets.min()), 0), got.shape[0])
    np.testing.assert_array_equal(got[unheld], 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_the_reference(name: str) -> None:
    rows, _, _, experts, *_ = CASES[name]
    run(grouped(*CASES[name]), rising_offsets(rows, experts, seed=len(name)))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "offsets",
    [
        [0, 0, 300, 300, 300, 300, 300, 300],  # all rows to expert 1, the others empty
        [0, 0, 0, 0, 0, 0, 0, 0],  # all rows to the last expert
        [0, 100, 100, 100, 150, 151, 299, 300],  # empty experts between, a one-row expert
        [37, 40, 100, 100, 120, 200, 250, 290],  # rows 0-36 belong to no expert: zero
        [0, 200, 100, 250, 90, 300, 280, 299],  # falling offsets: the last expert at or before wins
        [-5, 50, 400, 120, 130, 500, 260, 270],  # out of [0, S]: clamped, as the reference reads them
    ],
    ids=["one_expert", "last_expert", "empty_between", "rows_before_every_offset", "falling", "out_of_range"],
)
def test_crafted_offsets(offsets: list[int]) -> None:
    run(grouped(*CASES["ragged_k_n_8_experts"]), np.array(offsets))


FRONTEND_FORM = (300, 72, 88, 8, "bfloat16", True)
PATH_CHOICES = [
    {"path": "simt"},
    {"path": "mma", "block_m": 64, "block_n": 64, "stages": 4},
    dict(WGMMA_128X256),
    {"path": "ws", "block_n": 128, "stages": 6},
]


@pytest.mark.parametrize("arch", [80, 90])
def test_the_frontend_form_compiles_on_every_path(arch: int) -> None:
    """Token [1, S, K] and offsets [E, 1, 1]: the unit axis adds no offset, in the SIMT kernel
    and the tensor-core ones (wgmma on sm_90 only)."""
    g = grouped(*FRONTEND_FORM, frontend_form=True)
    for choice in PATH_CHOICES[: 4 if arch == 90 else 2]:
        (source,) = sources(g, arch, choice)
        assert compile_cubin(source.source, source.name, arch, source.arch_suffix)


@pytest.mark.gpu
@pytest.mark.parametrize("choice", PATH_CHOICES, ids=["simt", "mma", "wgmma", "ws"])
def test_the_frontend_form_matches_the_reference(choice: Mapping[str, Any] | None) -> None:
    run(grouped(*FRONTEND_FORM, frontend_form=True), rising_offsets(300, 8, seed=5), choice)


@pytest.mark.gpu
@pytest.mark.parametrize("int64", [False, True])
def test_64_experts_all_to_one_and_int64_offsets(int64: bool) -> None:
    offsets = np.where(np.arange(64) <= 17, 0, 1000)  # expert 17 holds every row
    run(grouped(*CASES["64_experts_fp16"][:-2], io="half", offsets="int64" if int64 else "int32"), offsets)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TILE_CANDIDATES, ids=lambda t: f"{t.block_m}x{t.block_n}x{t.stages}")
def test_every_mma_tile_matches(tile: Any) -> None:
    choice = {"path": "mma", "block_m": tile.block_m, "block_n": tile.block_n, "stages": tile.stages}
    run(grouped(*CASES["64_experts_fp16"]), rising_offsets(1000, 64, seed=11), choice)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", WGMMA_TILES, ids=lambda t: "x".join(map(str, t)))
def test_every_wgmma_tile_matches_on_sm_90(tile: tuple[int, int, int]) -> None:
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma runs on sm_90 only")
    choice = {"path": "wgmma", "block_m": tile[0], "block_n": tile[1], "stages": tile[2]}
    run(grouped(*CASES["k_major_weight"]), rising_offsets(257, 8, seed=5), choice)
    run(grouped(*CASES["ragged_k_n_8_experts"]), np.array([37, 40, 100, 100, 120, 200, 250, 290]), choice)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ws_tiles(), ids=lambda t: f"{t['block_n']}x{t['stages']}")
def test_every_engine_tile_matches_on_sm_90(tile: dict[str, object]) -> None:
    """Both weight layouts, 64 experts, crafted offsets, and more tiles than SMs."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the engine runs on sm_90 only")
    choice = {"path": "ws", **tile}
    run(grouped(*CASES["k_major_weight"]), rising_offsets(257, 8, seed=5), choice)
    run(grouped(*CASES["ragged_k_n_8_experts"]), np.array([37, 40, 100, 100, 120, 200, 250, 290]), choice)
    run(grouped(*CASES["64_experts_fp16"]), rising_offsets(1000, 64, seed=11), choice)
    run(grouped(*CASES["more_tiles_than_sms"]), rising_offsets(20000, 16, seed=2), choice)
