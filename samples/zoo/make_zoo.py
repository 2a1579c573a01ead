"""Write the benchmark zoo: ONNX files + specs for six reference networks (random weights, fixed
seed) into a cache folder outside git (default ~/.cache/packager/zoo).

    pip install torch==2.13.0          # CPU build; only this script needs it
    python samples/zoo/make_zoo.py [resnet18 resnet50 mobilenet_v2 bert_base gpt2_small vit_tiny bert_mini] [--out DIR]
    pack build ~/.cache/packager/zoo/resnet50/spec.yaml && pack bench ~/.cache/packager/zoo/resnet50/dist/resnet50
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# name: (constructor, input name, input shape, input kind, verify tolerance)
ZOO = {
    "resnet18": ("resnet18", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "resnet50": ("resnet50", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "mobilenet_v2": ("MobileNetV2", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "bert_base": ("Bert", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),
    "gpt2_small": ("GPT2", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),
    "vit_tiny": ("ViT", "image", [1, 3, 224, 224], "float", (1e-3, 1e-4)),
    "bert_mini": ("Bert", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),   # small enough to travel (gpu-suite)
}
# constructor arguments other than the defaults
KWARGS = {"bert_mini": dict(vocab=2000, dim=128, depth=4, heads=2, mlp=512)}
OPSET = 17


def default_out() -> Path:
    return Path(os.environ.get("PACKAGER_CACHE_DIR", Path.home() / ".cache" / "packager")).expanduser() / "zoo"


def export(name: str, out: Path) -> Path:
    import torch

    import models

    ctor, input_name, shape, kind, (rtol, atol) = ZOO[name]
    torch.manual_seed(0)
    net = getattr(models, ctor)(**KWARGS.get(name, {}))
    if kind == "ids":
        models.init_transformer(net)
    net.eval()
    example = torch.randint(0, 1000, shape) if kind == "ids" else torch.randn(shape)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (example,), str(model), dynamo=False, opset_version=OPSET,
                          input_names=[input_name], output_names=["output"], do_constant_folding=True)
    dtype = "int64" if kind == "ids" else "float32"
    (folder / "spec.yaml").write_text(
        f"# {name}: random weights (seed 0), written by samples/zoo/make_zoo.py\n"
        f"name: {name}\nmodel: model.onnx\ninputs:\n  {input_name}: {{dtype: {dtype}, shape: {shape}}}\n"
        f"targets: [x86-64]\nverify: {{rtol: {rtol}, atol: {atol}}}\n")
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models to write, of {list(ZOO)} (default: all)")
    ap.add_argument("--out", type=Path, default=default_out(), help="cache folder (default: %(default)s)")
    args = ap.parse_args()
    unknown = sorted(set(args.names) - set(ZOO))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(ZOO)}")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("make_zoo.py needs PyTorch: pip install torch==2.13.0")
    for name in args.names or list(ZOO):
        path = export(name, args.out)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {path.parent / 'spec.yaml'}")


if __name__ == "__main__":
    main()
