"""One module per kernel family; each exposes ``emit(fused, ctx) -> FusedProgram``."""
