"""packager: ahead-of-time model packager (ONNX + YAML spec -> standalone package)."""
import os

__version__ = "0.1.0"

# TVM's thread pool starts with half the logical CPUs (it assumes two hyperthreads per core), so
# on a 2-core build machine every kernel timed at build time ran on one thread, while a package
# runs on all online CPUs (the runtime's default). Measured decisions (Gensor's top-k, layouts,
# fusions, derive, the tuner) must see the threads the kernels will run with. Set before TVM's
# pool exists (it reads this once); a user's own setting wins.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
