"""The frontend's ``moe_grouped_matmul`` on graphdnn's op of the same name (graphdnn/ops/moe.py).

The frontend's tensors keep their form: token [1, S, K], first_token_offset [E, 1, 1] and the
output [1, S, N] are what graphdnn's op takes. Its modes:

- ``NONE``: the rows are already grouped by expert; one node.
- ``GATHER``: output row s is token row ``token_index[s]`` times its expert's weight. graphdnn
  gathers the rows first (``gather``, a copy of the picked rows), then multiplies: two kernels
  where the frontend's engine reads the rows inside the GEMM.
- ``SCATTER`` (and ``moe_grouped_matmul_bwd``) are refused, saying so.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from ..tensor import TensorSpec
from .enums import moe_grouped_matmul_mode
from .ops_base import MaybeTensor, OpsBase, compute_type


class MoeOps(OpsBase):
    """The grouped-matmul method of :class:`~graphdnn.cudnn.pygraph`, mixed in."""

    def moe_grouped_matmul(
        self,
        token: TensorSpec,
        weight: TensorSpec,
        first_token_offset: TensorSpec,
        token_index: MaybeTensor = None,
        token_ks: MaybeTensor = None,
        mode: Any = moe_grouped_matmul_mode.NONE,
        compute_data_type: Any = None,
        top_k: int = 0,
        name: str = "",
    ) -> TensorSpec:
        """Output [1, S, N]: each expert's rows of token [1, S, K] times its weight [K, N].
        ``top_k`` is read by SCATTER only."""
        node = self._node(name)
        mode_name = getattr(mode, "name", str(mode))
        if mode_name == "GATHER":
            if token_index is None:
                raise UnsupportedError("moe_grouped_matmul mode GATHER needs token_index", node=node)
            if token_index.dim is None or len(token_index.dim) != 3 or token_index.dim[::2] != (1, 1):
                raise UnsupportedError(
                    f"moe_grouped_matmul token_index '{token_index.name}' has dims {token_index.dim}; the frontend's "
                    "form is [1, rows, 1]",
                    node=node,
                )
            picks = self._spec.reshape(token_index, shape=[int(token_index.dim[1])], name=f"{node}::token_index")
            picks.set_data_type(token_index.data_type)  # indices, not the graph's intermediate type
            token = self._spec.gather(token, picks, axis=-2, name=f"{node}::gather")
        elif mode_name != "NONE":
            raise UnsupportedError(
                f"moe_grouped_matmul mode {mode_name}: graphdnn multiplies grouped rows (NONE) or gathers them first "
                "(GATHER); it has no scatter of the products (gather them with moe_unpermute instead)",
                node=node,
            )
        elif token_index is not None or token_ks is not None:
            raise UnsupportedError(
                "moe_grouped_matmul mode NONE reads neither token_index nor token_ks: the rows are grouped already",
                node=node,
            )
        output = self._spec.moe_grouped_matmul(
            token, weight, first_token_offset, compute_type(compute_data_type), name=node
        )
        return self._one(node, output, "Output")
