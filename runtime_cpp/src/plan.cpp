#include "plan.h"

#include <nlohmann/json.hpp>

#include "error.h"

namespace packrt {

using json = nlohmann::json;

static constexpr int kPlanVersion = 1;

static const struct {
  int32_t dtype;
  const char* name;
  size_t size;
} kDtypes[] = {{PACKRT_FLOAT32, "float32", 4}, {PACKRT_FLOAT16, "float16", 2}, {PACKRT_FLOAT64, "float64", 8},
               {PACKRT_INT8, "int8", 1},       {PACKRT_INT16, "int16", 2},     {PACKRT_INT32, "int32", 4},
               {PACKRT_INT64, "int64", 8},     {PACKRT_UINT8, "uint8", 1},     {PACKRT_BOOL, "bool", 1}};

int32_t dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  return PACKRT_DTYPE_UNKNOWN;
}

size_t dtype_size(int32_t dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.dtype) return d.size;
  return 0;
}

const char* dtype_name(int32_t dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.dtype) return d.name;
  return "unknown";
}

Plan parse_plan(const char* text, size_t size, const std::string& where) {
  auto bad = [&](const std::string& msg) { fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": " + msg); };
  Plan plan;
  try {
    json j = json::parse(text, text + size);
    if (j.value("format", "") != "packager-plan") bad("not a packager plan (format field)");
    if (j.value("version", 0) != kPlanVersion)
      fail(PACKRT_ERROR_UNSUPPORTED, where + ": plan version " + std::to_string(j.value("version", 0)) +
                                         " is not supported by this runtime (it reads version " +
                                         std::to_string(kPlanVersion) + ")");
    plan.target = j.at("target").get<std::string>();
    plan.device = j.value("device", "cpu");
    if (plan.device != "cpu" && plan.device != "cuda")
      fail(PACKRT_ERROR_UNSUPPORTED, where + ": device '" + plan.device + "' is not supported by this runtime");
    if (plan.device == "cuda") plan.module = j.at("module").get<std::string>();
    plan.weights_bytes = j.at("weights").at("bytes").get<uint64_t>();
    for (const auto& k : j.at("kernels")) {
      PlanKernel pk{k.at("name").get<std::string>(), k.at("symbol").get<std::string>(), k.at("num_args").get<int>(),
                    {}, {}};
      if (plan.device == "cuda") {
        pk.workspace = k.at("workspace").get<std::vector<uint64_t>>();
        for (const auto& l : k.at("launches")) {
          PlanLaunch pl;
          pl.function = l.at("function").get<std::string>();
          pl.args = l.at("args").get<std::vector<int>>();
          auto grid = l.at("grid").get<std::vector<unsigned>>(), block = l.at("block").get<std::vector<unsigned>>();
          if (grid.size() != 3 || block.size() != 3) bad("kernel '" + pk.name + "': grid and block need 3 extents");
          for (int d = 0; d < 3; ++d) {
            if (!grid[d] || !block[d]) bad("kernel '" + pk.name + "': zero launch extent");
            pl.grid[d] = grid[d];
            pl.block[d] = block[d];
          }
          pl.shared_bytes = l.value("shared_bytes", 0u);
          for (int a : pl.args)
            if (a >= pk.num_args || -a > static_cast<int>(pk.workspace.size()))
              bad("kernel '" + pk.name + "': launch argument " + std::to_string(a) + " out of range");
          pk.launches.push_back(std::move(pl));
        }
        if (pk.launches.empty()) bad("kernel '" + pk.name + "' has no launches");
      }
      plan.kernels.push_back(std::move(pk));
    }
    for (const auto& p : j.at("profiles")) {
      PlanProfile prof;
      prof.name = p.at("name").get<std::string>();
      prof.arena_bytes = p.at("arena_bytes").get<uint64_t>();
      for (const auto& t : p.at("tensors")) {
        PlanTensor pt;
        pt.dtype = dtype_from_name(t.at("dtype").get<std::string>());
        if (pt.dtype == PACKRT_DTYPE_UNKNOWN) bad("unknown dtype " + t.at("dtype").dump());
        pt.shape = t.at("shape").get<std::vector<int64_t>>();
        std::string storage = t.at("storage").get<std::string>();
        if (storage != "arena" && storage != "weights") bad("unknown tensor storage '" + storage + "'");
        pt.in_weights = storage == "weights";
        pt.offset = t.at("offset").get<uint64_t>();
        pt.nbytes = t.at("bytes").get<uint64_t>();
        uint64_t n = dtype_size(pt.dtype);
        for (int64_t d : pt.shape) {
          if (d < 0) bad("negative dimension in profile " + prof.name);
          n *= static_cast<uint64_t>(d);
        }
        if (pt.shape.size() > PACKRT_MAX_DIMS) bad("tensor rank above " + std::to_string(PACKRT_MAX_DIMS));
        if (n != pt.nbytes) bad("tensor byte size does not match its shape in profile " + prof.name);
        uint64_t limit = pt.in_weights ? plan.weights_bytes : prof.arena_bytes;
        if (pt.offset % 64 != 0 || pt.offset + pt.nbytes > limit)
          bad("tensor outside its " + storage + " region in profile " + prof.name);
        prof.tensors.push_back(std::move(pt));
      }
      auto tensor_id = [&](const json& v) {
        int id = v.get<int>();
        if (id < 0 || id >= static_cast<int>(prof.tensors.size())) bad("tensor index out of range in " + prof.name);
        return id;
      };
      for (const auto& io : p.at("inputs")) prof.inputs.push_back({io.at("name").get<std::string>(), tensor_id(io.at("tensor"))});
      for (const auto& io : p.at("outputs")) prof.outputs.push_back({io.at("name").get<std::string>(), tensor_id(io.at("tensor"))});
      for (const auto& io : prof.inputs)
        if (prof.tensors[io.tensor].in_weights) bad("input '" + io.name + "' is not an arena tensor");
      for (const auto& io : prof.outputs)
        if (prof.tensors[io.tensor].in_weights) bad("output '" + io.name + "' is not an arena tensor");
      for (const auto& s : p.at("steps")) {
        PlanStep st;
        std::string op = s.at("op").get<std::string>();
        for (const auto& a : s.at("args")) st.args.push_back(tensor_id(a));
        if (op == "kernel") {
          st.kind = PlanStep::kKernel;
          st.kernel = s.at("kernel").get<int>();
          if (st.kernel < 0 || st.kernel >= static_cast<int>(plan.kernels.size())) bad("kernel index out of range");
          if (static_cast<int>(st.args.size()) != plan.kernels[st.kernel].num_args)
            bad("step calls kernel '" + plan.kernels[st.kernel].name + "' with the wrong number of arguments");
        } else if (op == "copy") {
          st.kind = PlanStep::kCopy;
          if (st.args.size() != 2 || prof.tensors[st.args[0]].nbytes != prof.tensors[st.args[1]].nbytes)
            bad("malformed copy step in profile " + prof.name);
        } else {
          bad("unknown step op '" + op + "'");
        }
        prof.steps.push_back(std::move(st));
      }
      plan.profiles.push_back(std::move(prof));
    }
  } catch (const json::exception& e) {
    bad(std::string("malformed plan (") + e.what() + ")");
  }
  if (plan.profiles.empty()) bad("plan has no profiles");
  const auto& first = plan.profiles[0];
  for (const auto& p : plan.profiles) {
    if (p.inputs.size() != first.inputs.size() || p.outputs.size() != first.outputs.size())
      bad("profiles disagree on the number of inputs/outputs");
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (p.inputs[i].name != first.inputs[i].name) bad("profiles disagree on input names");
    for (size_t i = 0; i < p.outputs.size(); ++i)
      if (p.outputs[i].name != first.outputs[i].name) bad("profiles disagree on output names");
  }
  return plan;
}

}  // namespace packrt
