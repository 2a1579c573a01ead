// A package through ONNX Runtime's C++ API: register the custom-op library, load the wrapper
// model, run the CNN sample on a raw float32 input file, write the raw output.
//   ort_cpp_test MODEL.onnx LIBRARY.so INPUT.raw OUTPUT.raw
#include <onnxruntime_cxx_api.h>

#include <cstdio>
#include <fstream>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.onnx LIBRARY.so INPUT.raw OUTPUT.raw\n", argv[0]);
    return 2;
  }
  try {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "packager-test");
    Ort::SessionOptions so;
    so.RegisterCustomOpsLibrary(argv[2]);
    Ort::Session session(env, argv[1], so);
    std::vector<float> x(1 * 3 * 64 * 64);
    std::ifstream(argv[3], std::ios::binary).read(reinterpret_cast<char*>(x.data()), x.size() * sizeof(float));
    std::vector<int64_t> shape{1, 3, 64, 64};
    auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    Ort::Value input = Ort::Value::CreateTensor<float>(mem, x.data(), x.size(), shape.data(), shape.size());
    const char* in_names[] = {"image"};
    const char* out_names[] = {"logits"};
    auto out = session.Run(Ort::RunOptions{nullptr}, in_names, &input, 1, out_names, 1);
    auto info = out[0].GetTensorTypeAndShapeInfo();
    const float* y = out[0].GetTensorData<float>();
    std::ofstream(argv[4], std::ios::binary).write(reinterpret_cast<const char*>(y), info.GetElementCount() * sizeof(float));
    std::printf("ok: %zu outputs, first %g\n", info.GetElementCount(), y[0]);
  } catch (const Ort::Exception& e) {
    std::fprintf(stderr, "onnxruntime error: %s\n", e.what());
    return 1;
  }
  return 0;
}
