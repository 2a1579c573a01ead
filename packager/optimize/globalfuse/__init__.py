"""Global analysis and cross-operator fusion (Souffle, ASPLOS'24), as far as this version goes.

The pass looks at the whole kernel graph FuseOps left and fuses what rule-based fusion cannot:
layout-only kernels become index maps of their readers (vertical.py) and sibling matmuls that
read one tensor become one matmul on concatenated weights (horizontal.py, before layout
packing); copies of copies left over become one copy (chains.py); on the CPU a row reduction
joins the matmul reading it, and then the matmul producing its rows (the scores Q @ K^T: the
attention of a row tile in one region, rowregion.py), and a memory-intensive reduction (a 1x1
conv to a few channels) joins the conv or matmul it sums (epilogue.py); on a GPU a
chain of kernels becomes one cooperative kernel with grid barriers between its phases
(phases.py). Every proposed kernel is trial-scheduled for the target and refused when it would
lose its schedule; the report says what was taken, what was refused and why, and the kernel
count and estimated DRAM traffic before and after.
"""
from .driver import global_fusion
from .horizontal import combine_siblings

__all__ = ["combine_siblings", "global_fusion"]
