"""Frontend programs through ``graphdnn.cudnn`` on the NumPy reference plan (CPU torch buffers)."""

from __future__ import annotations

import pytest

from tests.cudnn_programs import PROGRAMS


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_program_runs_on_the_reference_plan(program: str) -> None:
    for result in PROGRAMS[program]("cpu"):
        result.check()
