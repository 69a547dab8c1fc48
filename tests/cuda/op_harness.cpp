// cuda_op_harness: every op of the CUDA backend against the CPU backend (the reference) on
// random shapes and inputs, like llama.cpp's test-backend-ops. One line per case:
//   PASS|FAIL op shape-desc rel=.. maxabs=.. (seed S)[: why][ | notes]
// then "N passed, M failed"; exit code 1 if any failed.
//   --seed N        rerun with the inputs of a previous run (the seed each line prints)
//   --filter A,B    run only cases whose "op desc" contains A or B (e.g. matmul, moe.cuda-fused)
//   --exclude A,B   leave out cases whose "op desc" contains A or B
//   --quick         fewer and smaller cases
//   --json FILE     every case as JSON (rewritten after each case, so a crash keeps the rest)
//   --threads N     CPU reference threads (default: all cores)
//   --reference-as-device  the CPU backend in place of CUDA: checks the harness without a GPU
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "harness.h"
#ifndef SY_HARNESS_NO_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace {

using sy::harness::Options;

int usage(const char* program, const char* problem) {
  std::fprintf(stderr, "%s: %s\nusage: %s [--seed N] [--filter NAME[,NAME...]] [--exclude NAME[,NAME...]] [--quick] [--json FILE] [--threads N] "
               "[--reference-as-device]\n", program, problem, program);
  return 2;
}

// A failure before any case can run (no backend): still the two lines the caller parses.
int setup_failure(const std::string& what, const std::string& message, uint64_t seed) {
  std::printf("FAIL %s %s rel=- maxabs=- (seed %llu)\n", what.c_str(), message.c_str(),
              static_cast<unsigned long long>(seed));
  std::printf("0 passed, 1 failed\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  options.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                 static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  options.seed %= 1000000007ull;  // short enough to retype
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--seed") {
      const char* v = value();
      if (!v) return usage(argv[0], "--seed needs a number");
      options.seed = std::strtoull(v, nullptr, 10);
    } else if (arg == "--filter" || arg == "--exclude") {
      const char* v = value();
      if (!v) return usage(argv[0], (arg + " needs a name").c_str());
      std::vector<std::string>& names = arg == "--filter" ? options.filters : options.excludes;
      std::string list = v;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!part.empty()) names.push_back(part);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--json") {
      const char* v = value();
      if (!v) return usage(argv[0], "--json needs a file name");
      options.json_path = v;
    } else if (arg == "--threads") {
      const char* v = value();
      if (!v) return usage(argv[0], "--threads needs a number");
      options.threads = std::atoi(v);
    } else if (arg == "--reference-as-device") {
      options.reference_as_device = true;
    } else if (arg == "--help" || arg == "-h") {
      usage(argv[0], "help");
      return 0;
    } else {
      return usage(argv[0], ("unknown argument " + arg).c_str());
    }
  }

  std::unique_ptr<sy::backend::Backend> cpu = sy::backend::make_cpu_backend({options.threads});
  std::unique_ptr<sy::backend::Backend> device, invariant;
  if (options.reference_as_device) {
    device = sy::backend::make_cpu_backend({options.threads});
    invariant = sy::backend::make_cpu_backend({options.threads});  // the CPU always is
  } else {
#ifdef SY_HARNESS_NO_CUDA
    return setup_failure("backend.create", "built without the CUDA backend (use --reference-as-device)", options.seed);
#else
    auto made = sy::backend::make_cuda_backend({0});
    if (!made) return setup_failure("backend.create", "cuda: " + made.message(), options.seed);
    device = std::move(made).value();
    auto made_invariant = sy::backend::make_cuda_backend({0, true});
    if (!made_invariant) return setup_failure("backend.create", "cuda: " + made_invariant.message(), options.seed);
    invariant = std::move(made_invariant).value();
#endif
  }

  // The largest step any case runs (the backends size their step workspace from it once).
  // Every case stays within these; the model-shape fields cover the largest case of each op.
  sy::backend::StepLimits limits;
  limits.max_tokens = 1024;         // matmul rows, prefill tokens, rope tokens
  limits.max_seqs = 64;             // sequences of an attention step (decode tokens <= this)
  limits.max_blocks_per_seq = 1024;  // context 5000 at block size 5
  limits.max_logits_rows = 4096;    // sampling: rows per sample() call
  limits.vocab_size = 151936;
  limits.num_heads = 32;
  limits.head_dim = 256;
  limits.max_feature_dim = 4096;  // widest matmul input
  limits.latent_kv_lora = 512;    // the latent attention cases' largest
  limits.latent_rope = 64;
  limits.latent_nope = 128;  // with v_dim and max_context: the expanded prefill's scratch
  limits.latent_v_dim = 128;
  limits.max_context = 5120;
  limits.linear_conv_dim = 1024;  // the gated_delta_net cases' widest (2 x 2 x 128 + 4 x 128)
  for (sy::backend::Backend* b : {cpu.get(), device.get(), invariant.get()}) {
    sy::Status reserved = b->reserve(limits);
    if (!reserved) return setup_failure("backend.reserve", b->name() + ": " + reserved.message(), options.seed);
  }

  sy::harness::Harness h(options, *cpu, *device);
  std::string kernels;
  for (const std::string& name : h.device_kernels.names(device->device())) kernels += (kernels.empty() ? "" : ",") + name;
  std::printf("cuda_op_harness: seed %llu, %s, device %s (kv cache %s, graphs %s, moe kernels %s, small-batch %s<=%lld)%s\n",
              static_cast<unsigned long long>(options.seed), options.quick ? "quick" : "full", device->name().c_str(),
              std::string(sy::dtype_name(device->kv_cache_dtype())).c_str(), device->supports_graphs() ? "yes" : "no",
              kernels.c_str(), device->small_batch_kernel().empty() ? "none" : device->small_batch_kernel().c_str(),
              static_cast<long long>(device->small_batch_max_tokens()),
              options.reference_as_device ? " [reference as device: harness self-check]" : "");
  std::fflush(stdout);

  // Simple ops first: a crash in a later suite still leaves their lines.
  sy::harness::run_weight_ops(h);
  sy::harness::run_basic_ops(h);
  sy::harness::run_attention_ops(h);
  sy::harness::run_linear_ops(h);
  sy::harness::run_sampling_ops(h);
  sy::harness::run_moe_ops(h);
  sy::harness::run_graph_ops(h);
  sy::harness::run_invariance_ops(h, *invariant);
  return h.finish();
}
