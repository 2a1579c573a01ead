// The smallest complete deployment: open a package, feed .npy inputs, write .npy outputs.
// Links only libpackrt (no Python, no TVM).
//   packrt-example PKG OUT_DIR IN0.npy [IN1.npy ...]     (inputs in the model's order)
#include <packrt/npy.hpp>
#include <packrt/packrt.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PACKAGE OUT_DIR INPUT.npy...\n", argv[0]);
    return 2;
  }
  try {
    packrt::Model model(argv[1]);

    std::vector<packrt::npy::Array> arrays;
    std::vector<packrt_tensor> inputs;
    auto infos = model.inputs();
    for (int i = 3; i < argc; ++i) {
      arrays.push_back(packrt::npy::load(argv[i]));
      auto& a = arrays.back();
      if (a.shape.size() > PACKRT_MAX_DIMS) throw std::runtime_error(std::string(argv[i]) + ": too many dimensions");
      packrt_tensor t = packrt::make_tensor(infos.at(i - 3), a.data.get(), a.nbytes);
      t.dtype = a.dtype;  // the runtime checks dtype and shape against the package
      t.ndim = static_cast<int32_t>(a.shape.size());
      std::copy(a.shape.begin(), a.shape.end(), t.shape);
      inputs.push_back(t);
    }
    // Pick the profile whose input shapes match, to size the output buffers.
    int profile = 0;
    for (int p = 0; p < model.num_profiles(); ++p) {
      auto want = model.inputs(p);
      bool same = want.size() == arrays.size();
      for (size_t k = 0; same && k < want.size(); ++k) same = want[k].shape == arrays[k].shape;
      if (same) profile = p;
    }
    std::vector<packrt::npy::Array> results;
    std::vector<packrt_tensor> outputs;
    for (auto& info : model.outputs(profile)) {
      results.push_back(packrt::npy::Array::allocate(info.dtype, info.shape));
      outputs.push_back(packrt::make_tensor(info, results.back().data.get(), results.back().nbytes));
    }
    model.run(inputs, outputs);
    auto out_infos = model.outputs(profile);
    for (size_t k = 0; k < outputs.size(); ++k) {
      std::string path = std::string(argv[2]) + "/" + out_infos[k].name + ".npy";
      packrt::npy::save(path, outputs[k].dtype, outputs[k].shape, outputs[k].ndim, outputs[k].data,
                        results[k].nbytes);
      std::printf("wrote %s\n", path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
