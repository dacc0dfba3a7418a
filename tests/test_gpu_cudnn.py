"""Frontend programs through ``graphdnn.cudnn`` on the GPU (`gpu` marker): the programs of
tests/cudnn_programs.py with CUDA torch tensors, run on the compiled plan."""

from __future__ import annotations

import pytest

from tests.cudnn_programs import PROGRAMS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_program_runs_on_the_gpu(program: str) -> None:
    import torch

    results = PROGRAMS[program]("cuda")
    torch.cuda.synchronize()
    for result in results:
        result.check()
