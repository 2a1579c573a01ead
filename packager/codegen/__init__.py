"""Codegen: the kernel graph (graph), one backend per device kind behind one interface (backend,
cpu, cuda + cuda_source/cuda_toolchain), the per-unit compile stages (compile) and kernel cost."""
