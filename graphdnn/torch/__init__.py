"""graphdnn for PyTorch users: graphs as torch operators, and torch models as graphs.

``custom_op(plan_or_graph, "ns::name")`` registers a graph as a ``torch.library`` custom
op (eager, ``torch.compile``, ``torch.export``, CUDA graphs); ``from_torch(module,
example_inputs)`` imports a ``torch.export`` program as an OperationGraphSpec. torch is
imported only when they are called, so ``import graphdnn`` works without it. (Inside
this package ``import torch`` is PyTorch: imports are absolute.)
"""

from ..torch_import import from_torch
from .custom_op import custom_op
from .op_schema import OpSchema, op_schema

__all__ = ["OpSchema", "custom_op", "from_torch", "op_schema"]
