"""The GPU runtime: CUDA driver calls, buffers from torch/CuPy/DLPack, module loading, launches.

Imported only when a GPU plan is bound or executed, so that building plans and warming
caches never needs a GPU or its driver.
"""
