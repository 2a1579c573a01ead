"""packager: ahead-of-time model packager (ONNX + YAML spec -> standalone package)."""

__version__ = "0.1.0"
