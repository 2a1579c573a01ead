#include "plan.h"

#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>

#include "checked.h"
#include "error.h"

namespace packrt {

using json = nlohmann::json;

// 3: CUDA launches may be cooperative; 4: assemble steps (a concat's parts written in place)
static constexpr int kPlanVersion = 4, kOldestPlanVersion = 3;
static constexpr int kMaxKernelArgs = 1 << 16;
static constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 48;   // beyond any machine: a corrupt size

static const struct {
  int32_t dtype;
  const char* name;
  size_t size;
} kDtypes[] = {{PACKRT_FLOAT32, "float32", 4}, {PACKRT_FLOAT16, "float16", 2}, {PACKRT_FLOAT64, "float64", 8},
               {PACKRT_INT8, "int8", 1},       {PACKRT_INT16, "int16", 2},     {PACKRT_INT32, "int32", 4},
               {PACKRT_INT64, "int64", 8},     {PACKRT_UINT8, "uint8", 1},     {PACKRT_BOOL, "bool", 1},
               {PACKRT_UINT16, "uint16", 2}};

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

namespace {

// A malformed plan: PACKRT_ERROR_CORRUPT_PACKAGE, naming the file.
struct Bad {
  const std::string& where;
  [[noreturn]] void operator()(const std::string& msg) const { fail(PACKRT_ERROR_CORRUPT_PACKAGE, where + ": " + msg); }
};

// The header: format, version, target, device (and a CUDA plan's module), weights size.
void parse_header(const json& j, Plan& plan, const Bad& bad) {
  if (j.value("format", "") != "packager-plan") bad("not a packager plan (format field)");
  int version = json_int<int>(j, "version", bad.where);
  if (version < kOldestPlanVersion || version > kPlanVersion)
    fail(PACKRT_ERROR_UNSUPPORTED, bad.where + ": plan version " + std::to_string(version) +
                                       " is not supported by this runtime (it reads versions " +
                                       std::to_string(kOldestPlanVersion) + " to " + std::to_string(kPlanVersion) + ")");
  plan.target = j.at("target").get<std::string>();
  plan.device = j.value("device", "cpu");
  if (plan.device != "cpu" && plan.device != "cuda")
    fail(PACKRT_ERROR_UNSUPPORTED, bad.where + ": device '" + plan.device + "' is not supported by this runtime");
  if (plan.device == "cuda") plan.module = j.at("module").get<std::string>();
  plan.weights_bytes = json_int<uint64_t>(j.at("weights"), "bytes", bad.where + ": weights");
}

// One device-kernel launch of CUDA kernel `pk` (its args and workspace already read).
PlanLaunch parse_launch(const json& l, const PlanKernel& pk, const Bad& bad) {
  PlanLaunch pl;
  pl.function = l.at("function").get<std::string>();
  const std::string what = bad.where + ": kernel '" + pk.name + "' launch ";
  pl.args = json_ints<int>(l.at("args"), what + "args");
  auto grid = json_ints<unsigned>(l.at("grid"), what + "grid"), block = json_ints<unsigned>(l.at("block"), what + "block");
  if (grid.size() != 3 || block.size() != 3) bad("kernel '" + pk.name + "': grid and block need 3 extents");
  for (int d = 0; d < 3; ++d) {
    if (!grid[d] || !block[d]) bad("kernel '" + pk.name + "': zero launch extent");
    pl.grid[d] = grid[d];
    pl.block[d] = block[d];
  }
  pl.shared_bytes = l.contains("shared_bytes") ? json_int<unsigned>(l.at("shared_bytes"), what + "shared_bytes") : 0u;
  if (l.contains("cooperative")) {
    if (!l.at("cooperative").is_boolean()) bad("kernel '" + pk.name + "': launch 'cooperative' is not true/false");
    pl.cooperative = l.at("cooperative").get<bool>();
  }
  for (int a : pl.args)   // a < 0: scratch buffer -(a + 1), computed in 64 bits (no INT_MIN negation)
    if (a >= pk.num_args || (a < 0 && -static_cast<int64_t>(a) > static_cast<int64_t>(pk.workspace.size())))
      bad("kernel '" + pk.name + "': launch argument " + std::to_string(a) + " out of range");
  return pl;
}

// A kernel: name, symbol, argument count, whether its parallel tasks must run together (CPU);
// for CUDA plans its workspace and launches.
PlanKernel parse_kernel(const json& k, const Plan& plan, const Bad& bad) {
  PlanKernel pk{k.at("name").get<std::string>(), k.at("symbol").get<std::string>(), 0, false, {}, {}};
  pk.num_args = json_int<int>(k, "num_args", bad.where + ": kernel '" + pk.name + "'");
  if (pk.num_args < 0 || pk.num_args > kMaxKernelArgs) bad("kernel '" + pk.name + "': bad argument count");
  if (k.contains("parallel")) {   // CPU kernels that call the parallel barrier: "together"
    if (!k.at("parallel").is_string() || k.at("parallel").get<std::string>() != "together")
      bad("kernel '" + pk.name + "': \"parallel\" must be \"together\"");
    pk.together = true;
  }
  if (plan.device == "cuda") {
    pk.workspace = json_ints<uint64_t>(k.at("workspace"), bad.where + ": kernel '" + pk.name + "' workspace");
    if (pk.workspace.size() > 1024) bad("kernel '" + pk.name + "' has more than 1024 scratch buffers");
    for (uint64_t b : pk.workspace)      // sizes the CUDA backend rounds up and sums: keep them far from wrapping
      if (b > kMaxArenaBytes) bad("kernel '" + pk.name + "' asks for a " + std::to_string(b) + "-byte scratch buffer");
    for (const auto& l : k.at("launches")) pk.launches.push_back(parse_launch(l, pk, bad));
    if (pk.launches.empty()) bad("kernel '" + pk.name + "' has no launches");
  }
  return pk;
}

// A tensor of profile `prof`: dtype, shape, and a byte range inside the arena or the weights.
PlanTensor parse_tensor(const json& t, const Plan& plan, const PlanProfile& prof, const Bad& bad) {
  PlanTensor pt;
  pt.dtype = dtype_from_name(t.at("dtype").get<std::string>());
  if (pt.dtype == PACKRT_DTYPE_UNKNOWN) bad("unknown dtype " + t.at("dtype").dump());
  pt.shape = json_ints<int64_t>(t.at("shape"), bad.where + ": tensor shape in profile " + prof.name);
  std::string storage = t.at("storage").get<std::string>();
  if (storage != "arena" && storage != "weights") bad("unknown tensor storage '" + storage + "'");
  pt.in_weights = storage == "weights";
  pt.offset = json_int<uint64_t>(t, "offset", bad.where + ": tensor in profile " + prof.name);
  pt.nbytes = json_int<uint64_t>(t, "bytes", bad.where + ": tensor in profile " + prof.name);
  if (pt.shape.size() > PACKRT_MAX_DIMS) bad("tensor rank above " + std::to_string(PACKRT_MAX_DIMS));
  uint64_t n = dtype_size(pt.dtype), end = 0;
  for (int64_t d : pt.shape) {
    if (d < 0) bad("negative dimension in profile " + prof.name);
    if (mul_overflows(n, static_cast<uint64_t>(d), &n)) bad("tensor size overflows in profile " + prof.name);
  }
  if (n != pt.nbytes) bad("tensor byte size does not match its shape in profile " + prof.name);
  uint64_t limit = pt.in_weights ? plan.weights_bytes : prof.arena_bytes;
  if (pt.offset % 64 != 0 || add_overflows(pt.offset, pt.nbytes, &end) || end > limit)
    bad("tensor outside its " + storage + " region in profile " + prof.name);
  return pt;
}

int tensor_id(const json& v, const PlanProfile& prof, const Bad& bad) {
  int id = json_int<int>(v, bad.where + ": tensor index in profile " + prof.name);
  if (id < 0 || id >= static_cast<int>(prof.tensors.size())) bad("tensor index out of range in " + prof.name);
  return id;
}

// The profile's inputs and outputs: named arena tensors.
void parse_io(const json& p, PlanProfile& prof, const Bad& bad) {
  auto io_of = [&](const json& io) {
    return PlanIO{io.at("name").get<std::string>(), tensor_id(io.at("tensor"), prof, bad)};
  };
  for (const auto& io : p.at("inputs")) prof.inputs.push_back(io_of(io));
  for (const auto& io : p.at("outputs")) prof.outputs.push_back(io_of(io));
  for (const auto& io : prof.inputs)
    if (prof.tensors[io.tensor].in_weights) bad("input '" + io.name + "' is not an arena tensor");
  for (const auto& io : prof.outputs)
    if (prof.tensors[io.tensor].in_weights) bad("output '" + io.name + "' is not an arena tensor");
}

// An assemble step's parts lie end to end in the arena and cover exactly its whole (last arg).
void check_assembly(const std::vector<int>& args, const PlanProfile& prof, const Bad& bad) {
  if (args.size() < 2) bad("malformed assemble step in profile " + prof.name);
  const PlanTensor& whole = prof.tensors[args.back()];
  uint64_t at = whole.offset;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    const PlanTensor& part = prof.tensors[args[i]];
    if (part.in_weights || whole.in_weights || part.offset != at || args[i] == args.back())
      bad("assemble step in profile " + prof.name + ": its parts do not lie end to end in the arena range of tensor " +
          std::to_string(args.back()));
    at += part.nbytes;
  }
  if (at != whole.offset + whole.nbytes)
    bad("assemble step in profile " + prof.name + ": its parts do not cover tensor " + std::to_string(args.back()));
}

// A step: a kernel call on tensor ids, a copy between two tensors of the same size, or an
// assembly of parts already in place.
PlanStep parse_step(const json& s, const Plan& plan, const PlanProfile& prof, const Bad& bad) {
  PlanStep st;
  std::string op = s.at("op").get<std::string>();
  for (const auto& a : s.at("args")) st.args.push_back(tensor_id(a, prof, bad));
  if (op == "kernel") {
    st.kind = PlanStep::kKernel;
    st.kernel = json_int<int>(s, "kernel", bad.where + ": step in profile " + prof.name);
    if (st.kernel < 0 || st.kernel >= static_cast<int>(plan.kernels.size())) bad("kernel index out of range");
    if (static_cast<int>(st.args.size()) != plan.kernels[st.kernel].num_args)
      bad("step calls kernel '" + plan.kernels[st.kernel].name + "' with the wrong number of arguments");
    st.num_outputs = json_int<int>(s, "outputs", bad.where + ": step in profile " + prof.name);
    if (st.num_outputs < 1 || st.num_outputs > static_cast<int>(st.args.size()))
      bad("step calls kernel '" + plan.kernels[st.kernel].name + "' with a bad output count");
  } else if (op == "copy") {
    st.kind = PlanStep::kCopy;
    if (st.args.size() != 2 || prof.tensors[st.args[0]].nbytes != prof.tensors[st.args[1]].nbytes)
      bad("malformed copy step in profile " + prof.name);   // weights and overlaps: check_dataflow
  } else if (op == "assemble") {
    st.kind = PlanStep::kAssemble;
    check_assembly(st.args, prof, bad);
  } else {
    bad("unknown step op '" + op + "'");
  }
  return st;
}

bool overlap(const PlanTensor& a, const PlanTensor& b) {
  return a.in_weights == b.in_weights && a.nbytes && b.nbytes && a.offset < b.offset + b.nbytes &&
         b.offset < a.offset + a.nbytes;
}

// The profile's data flow, run symbolically: every arena tensor is an input or is written by
// exactly one step (never a weight), a step reads only tensors that hold their value (written
// and not overwritten since through an overlapping range), a step's outputs overlap neither its
// inputs nor each other, and every output holds its value at the end. This is what makes the
// memory plan's reuse of arena ranges safe; a plan that breaks it would compute wrong results.
void check_dataflow(const PlanProfile& prof, const Bad& bad) {
  const size_t n = prof.tensors.size();
  std::vector<char> holds(n, 0), written(n, 0);
  for (size_t t = 0; t < n; ++t) holds[t] = prof.tensors[t].in_weights;
  for (const auto& io : prof.inputs) holds[io.tensor] = written[io.tensor] = 1;
  std::vector<int> by_offset;   // arena tensors by offset, with the largest end so far: finds overlaps
  for (size_t t = 0; t < n; ++t)
    if (!prof.tensors[t].in_weights) by_offset.push_back(static_cast<int>(t));
  std::sort(by_offset.begin(), by_offset.end(),
            [&](int a, int b) { return prof.tensors[a].offset < prof.tensors[b].offset; });
  std::vector<uint64_t> max_end(by_offset.size());
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const PlanTensor& t = prof.tensors[by_offset[i]];
    max_end[i] = std::max(i ? max_end[i - 1] : 0, t.offset + t.nbytes);
  }
  uint64_t budget = uint64_t(1) << 28;   // overlap visits: a plan needing more is not one we wrote
  auto clobber = [&](int w) {            // w was just written: what overlaps it lost its value
    const PlanTensor& tw = prof.tensors[w];
    auto end = std::lower_bound(by_offset.begin(), by_offset.end(), tw.offset + tw.nbytes,
                                [&](int a, uint64_t off) { return prof.tensors[a].offset < off; });
    for (auto i = end - by_offset.begin(); i-- > 0 && max_end[i] > tw.offset;) {
      if (!budget--) bad("profile " + prof.name + " has too many overlapping tensors to check");
      if (by_offset[i] != w && overlap(prof.tensors[by_offset[i]], tw)) holds[by_offset[i]] = 0;
    }
  };
  for (size_t s = 0; s < prof.steps.size(); ++s) {
    const PlanStep& st = prof.steps[s];
    const std::string at = "step " + std::to_string(s) + " of profile " + prof.name;
    const size_t first_out = st.args.size() - static_cast<size_t>(st.num_outputs);
    for (size_t i = 0; i < first_out; ++i)
      if (!holds[st.args[i]])
        bad(at + " reads tensor " + std::to_string(st.args[i]) +
            " before it is written or after an overlapping tensor overwrote it");
    for (size_t o = first_out; o < st.args.size(); ++o) {
      int w = st.args[o];
      if (prof.tensors[w].in_weights) bad(at + " writes into the weights");
      if (written[w]) bad(at + " writes tensor " + std::to_string(w) + ", an input or a tensor already written");
      for (size_t i = 0; i < st.args.size() && st.kind != PlanStep::kAssemble; ++i)
        if (i != o && (st.args[i] == w || overlap(prof.tensors[st.args[i]], prof.tensors[w])))
          bad(at + " writes tensor " + std::to_string(w) + " over another of its own arguments");
    }
    for (size_t o = first_out; o < st.args.size(); ++o) {
      written[st.args[o]] = holds[st.args[o]] = 1;
      if (st.kind != PlanStep::kAssemble) clobber(st.args[o]);   // an assembly rewrites no byte
    }
  }
  for (const auto& io : prof.outputs)
    if (!holds[io.tensor]) bad("output '" + io.name + "' of profile " + prof.name + " is not computed by its steps");
}

// Weight tensors are disjoint or the very same bytes (the writer stores identical constants once);
// a partial overlap means one constant reads another's bytes.
void check_weights_disjoint(const PlanProfile& prof, const Bad& bad) {
  std::vector<const PlanTensor*> w;
  for (const auto& t : prof.tensors)
    if (t.in_weights && t.nbytes) w.push_back(&t);
  std::sort(w.begin(), w.end(), [](auto a, auto b) { return std::tie(a->offset, a->nbytes) < std::tie(b->offset, b->nbytes); });
  uint64_t end = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    bool same = i && w[i]->offset == w[i - 1]->offset && w[i]->nbytes == w[i - 1]->nbytes;
    if (!same && w[i]->offset < end) bad("two weight tensors of profile " + prof.name + " partly overlap");
    end = std::max(end, w[i]->offset + w[i]->nbytes);
  }
}

PlanProfile parse_profile(const json& p, const Plan& plan, const Bad& bad) {
  PlanProfile prof;
  prof.name = p.at("name").get<std::string>();
  prof.arena_bytes = json_int<uint64_t>(p, "arena_bytes", bad.where + ": profile " + prof.name);
  if (prof.arena_bytes > kMaxArenaBytes) bad("profile " + prof.name + " asks for an arena of " +
                                             std::to_string(prof.arena_bytes) + " bytes");
  for (const auto& t : p.at("tensors")) prof.tensors.push_back(parse_tensor(t, plan, prof, bad));
  parse_io(p, prof, bad);
  for (const auto& s : p.at("steps")) prof.steps.push_back(parse_step(s, plan, prof, bad));
  check_weights_disjoint(prof, bad);
  check_dataflow(prof, bad);
  return prof;
}

// Every profile has the first one's inputs and outputs (names and count), in the same order.
void check_profiles_agree(const Plan& plan, const Bad& bad) {
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
}

}  // namespace

Plan parse_plan(const char* text, size_t size, const std::string& where) {
  const Bad bad{where};
  Plan plan;
  try {
    json j = json::parse(text, text + size);
    parse_header(j, plan, bad);
    for (const auto& k : j.at("kernels")) plan.kernels.push_back(parse_kernel(k, plan, bad));
    for (const auto& p : j.at("profiles")) plan.profiles.push_back(parse_profile(p, plan, bad));
  } catch (const json::exception& e) {
    bad(std::string("malformed plan (") + e.what() + ")");
  }
  check_profiles_agree(plan, bad);
  return plan;
}

}  // namespace packrt
