"""Write the benchmark zoo: ONNX files + specs for the reference networks (random weights, fixed
seed) into a cache folder outside git (default ~/.cache/packager/zoo).

    pip install torch==2.13.0          # CPU build; only this script needs it
    python samples/zoo/make_zoo.py [resnet18 resnet50 mobilenet_v2 bert_base gpt2_small vit_tiny bert_mini
                                    bert_hf bert_hf_mini infogan csrnet_block speech_rnn] [--out DIR]
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

# name: (constructor, input name(s), input shape, input kind, verify tolerance); kinds: "float" (an
# image), "ids" (token ids), "ids+mask" (token ids and an attention mask, both int64 of that shape)
ZOO = {
    "resnet18": ("resnet18", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "resnet50": ("resnet50", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "mobilenet_v2": ("MobileNetV2", "image", [1, 3, 224, 224], "float", (1e-4, 1e-4)),
    "bert_base": ("Bert", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),
    "gpt2_small": ("GPT2", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),
    "vit_tiny": ("ViT", "image", [1, 3, 224, 224], "float", (1e-3, 1e-4)),
    "bert_mini": ("Bert", "input_ids", [1, 128], "ids", (1e-3, 1e-4)),   # small enough to travel (gpu-suite)
    # Hugging Face's BERT layout: separate Q/K/V projections, an attention mask
    "bert_hf": ("BertHF", ("input_ids", "attention_mask"), [1, 128], "ids+mask", (1e-3, 1e-4)),
    "bert_hf_mini": ("BertHF", ("input_ids", "attention_mask"), [1, 128], "ids+mask", (1e-3, 1e-4)),
    "infogan": ("InfoGAN", "z", [1, 228, 1, 1], "float", (1e-4, 1e-4)),      # ConvTranspose (derive)
    "csrnet_block": ("CSRNetBlock", "features", [1, 64, 28, 28], "float", (1e-4, 1e-4)),   # dilated convs
    "speech_rnn": ("SpeechRNN", "features", [1, 200, 40], "float", (1e-4, 1e-4)),         # GRU + LSTM loops
}
# constructor arguments other than the defaults
KWARGS = {"bert_mini": dict(vocab=2000, dim=128, depth=4, heads=2, mlp=512),
          "bert_hf_mini": dict(vocab=2000, dim=128, depth=2, heads=2, mlp=512)}
OPSET = 17
PADDING = 28   # "ids+mask": verify feeds a mask of ones with this many padded (0) positions at the end


def default_out() -> Path:
    return Path(os.environ.get("PACKAGER_CACHE_DIR", Path.home() / ".cache" / "packager")).expanduser() / "zoo"


def export(name: str, out: Path) -> Path:
    import torch

    import models

    ctor, input_names, shape, kind, (rtol, atol) = ZOO[name]
    input_names = [input_names] if isinstance(input_names, str) else list(input_names)
    torch.manual_seed(0)
    net = getattr(models, ctor)(**KWARGS.get(name, {}))
    if kind != "float":
        models.init_transformer(net)
    net.eval()
    if kind == "float":
        example = (torch.randn(shape),)
    else:
        example = (torch.randint(0, 1000, shape),)
        if kind == "ids+mask":
            example += (torch.ones(shape, dtype=torch.int64),)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, example, str(model), dynamo=False, opset_version=OPSET,
                          input_names=input_names, output_names=["output"], do_constant_folding=True)
    dtype = "float32" if kind == "float" else "int64"
    inputs = "".join(f"  {n}: {{dtype: {dtype}, shape: {shape}}}\n" for n in input_names)
    # verify draws random ints (0..3) for int inputs: the mask is pinned to ones, the last PADDING zero
    pinned = (f", inputs: {{{input_names[1]}: {[1] * (shape[-1] - PADDING) + [0] * PADDING}}}"
              if kind == "ids+mask" else "")
    (folder / "spec.yaml").write_text(
        f"# {name}: random weights (seed 0), written by samples/zoo/make_zoo.py\n"
        f"name: {name}\nmodel: model.onnx\ninputs:\n{inputs}"
        f"targets: [x86-64]\nverify: {{rtol: {rtol}, atol: {atol}{pinned}}}\n")
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
