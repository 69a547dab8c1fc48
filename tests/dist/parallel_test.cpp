// Tensor and expert parallel on the CPU: the single-process communicator's collectives, the
// rank-agreement check of routes, the sharding plan, and whole tiny models run as 2 or 4 ranks
// on threads giving TP=1's logits (to f32 summation order) and the very same routes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "dist/local_communicator.h"
#include "dist/shard_model.h"
#include "dist/sharding.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/presets.h"
#include "tensor/dtype.h"

namespace sy::dist {
namespace {

TEST(LocalGroup, AllReduceGivesEveryRankTheSameSum) {
  LocalGroup group(3);
  std::vector<std::vector<float>> got(3);
  std::vector<std::vector<uint16_t>> got_bf16(3);
  Status status = group.run([&](Communicator& comm) -> Status {
    const int r = comm.rank();
    std::vector<float> data = {0.1f * (r + 1), 1e8f * (r == 1 ? 1 : -0.5f), static_cast<float>(r)};
    SY_TRY(comm.all_reduce_sum(data.data(), 3, DType::kF32));
    std::vector<uint16_t> half = {f32_to_bf16(1.5f * r), f32_to_bf16(-2.0f)};
    SY_TRY(comm.all_reduce_sum(half.data(), 2, DType::kBF16));
    got[r] = data;
    got_bf16[r] = half;
    return Status::ok();
  });
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_FLOAT_EQ(got[0][0], 0.1f + 0.2f + 0.3f);
  EXPECT_EQ(got[0][2], 3.0f);
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), 12), 0) << "rank " << r;
    EXPECT_EQ(got_bf16[r], got_bf16[0]);
  }
  EXPECT_EQ(bf16_to_f32(got_bf16[0][0]), 4.5f);
  EXPECT_EQ(bf16_to_f32(got_bf16[0][1]), -6.0f);
}

TEST(LocalGroup, GatherScatterAllToAllBroadcast) {
  LocalGroup group(3);
  std::mutex mutex;
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    std::lock_guard lock(mutex);
    if (!ok) failures.push_back(what);
  };
  Status status = group.run([&](Communicator& comm) -> Status {
    const int r = comm.rank(), n = comm.size();
    int32_t mine[2] = {10 * r, 10 * r + 1};
    std::vector<int32_t> all(6);
    SY_TRY(comm.all_gather(mine, all.data(), 2, DType::kI32));
    expect(all == std::vector<int32_t>({0, 1, 10, 11, 20, 21}),
           "all_gather on rank " + std::to_string(r));
    // reduce_scatter: block b of rank r holds r + b; rank r gets sum over ranks of block r.
    std::vector<float> blocks(6);
    for (int b = 0; b < 3; ++b) blocks[2 * b] = blocks[2 * b + 1] = static_cast<float>(r + b);
    float out[2];
    SY_TRY(comm.reduce_scatter_sum(blocks.data(), out, 2, DType::kF32));
    expect(out[0] == 3.0f * r + 3.0f && out[1] == out[0],
           "reduce_scatter on rank " + std::to_string(r));
    // all_to_all: rank s sends s + d + 1 elements of value 100 s + d to rank d.
    std::vector<int64_t> send(n), recv(n);
    std::vector<int32_t> in;
    for (int d = 0; d < n; ++d) {
      send[d] = r + d + 1;
      recv[d] = d + r + 1;
      in.insert(in.end(), static_cast<size_t>(send[d]), 100 * r + d);
    }
    std::vector<int32_t> got(
        static_cast<size_t>(std::accumulate(recv.begin(), recv.end(), int64_t{0})));
    SY_TRY(comm.all_to_all(in.data(), send, got.data(), recv, DType::kI32));
    std::vector<int32_t> want;
    for (int s = 0; s < n; ++s) want.insert(want.end(), static_cast<size_t>(recv[s]), 100 * s + r);
    expect(got == want, "all_to_all on rank " + std::to_string(r));
    char plan[8] = {};
    if (r == 2) std::memcpy(plan, "step 42", 8);
    SY_TRY(comm.broadcast(plan, 8, 2));
    expect(std::string(plan) == "step 42", "broadcast on rank " + std::to_string(r));
    return comm.barrier();
  });
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_TRUE(failures.empty()) << failures.front();
}

TEST(LocalGroup, MismatchedArgumentsAreAnErrorOnEveryRank) {
  LocalGroup group(2);
  std::vector<Status> seen(2);
  Status status = group.run([&](Communicator& comm) -> Status {
    std::vector<float> data(4, 1.0f);
    seen[comm.rank()] = comm.all_reduce_sum(data.data(), comm.rank() == 0 ? 4 : 3, DType::kF32);
    std::vector<int64_t> send = {1, comm.rank() == 0 ? 2 : 1}, recv = {1, 1};
    int32_t in[3] = {}, out[2] = {};
    Status a2a = comm.all_to_all(in, send, out, recv, DType::kI32);
    if (a2a.is_ok()) return Status::error("all_to_all accepted counts that disagree");
    return seen[comm.rank()];
  });
  EXPECT_FALSE(status.is_ok());
  for (const Status& s : seen) {
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("rank 1 passed 3"), std::string::npos) << s.message();
  }
}

TEST(RouteAgreement, CatchesAnInjectedDisagreement) {
  LocalGroup group(3);
  const int64_t layers = 2, top_k = 2;
  std::vector<int32_t> routes = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 tokens
  Status agreed = group.run(
      [&](Communicator& comm) { return check_routes_agree(comm, routes, layers, top_k); });
  EXPECT_TRUE(agreed.is_ok()) << agreed.message();
  Status disagreed = group.run([&](Communicator& comm) {
    std::vector<int32_t> mine = routes;
    if (comm.rank() == 2) mine[7] = 0;  // token 1, layer 1, slot 1
    return check_routes_agree(comm, mine, layers, top_k);
  });
  ASSERT_FALSE(disagreed.is_ok());
  EXPECT_EQ(disagreed.code(), ErrorCode::kInternal);
  EXPECT_NE(disagreed.message().find(
                "token row 1, layer 1, slot 1: rank 2 chose expert 0, rank 0 expert 8"),
            std::string::npos)
      << disagreed.message();
}

TEST(Sharding, PlanSplitsHeadsExpertsAndRefusesWhatDoesNotDivide) {
  model::ModelConfig c;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.intermediate_size = 64;
  c.moe_intermediate_size = 16;
  c.num_experts = 8;
  auto shard = shard_for_rank(c, {2, false}, 1);
  ASSERT_TRUE(shard.is_ok()) << shard.message();
  EXPECT_EQ(shard->heads.begin, 4);
  EXPECT_EQ(shard->kv_heads.begin, 2);
  EXPECT_EQ(shard->moe_columns.begin, 8);
  EXPECT_EQ(shard->experts.count, 8);
  auto ep = shard_for_rank(c, {4, true}, 3);
  ASSERT_TRUE(ep.is_ok()) << ep.message();
  EXPECT_EQ(ep->experts.begin, 6);
  EXPECT_EQ(ep->experts.count, 2);
  EXPECT_EQ(ep->moe_columns.count, 16);
  auto bad = shard_for_rank(c, {3, false}, 0);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("--tensor-parallel 3 does not divide num_attention_heads (8)"),
            std::string::npos);

  const int32_t ids[] = {0, 7, 3, 4, 5, 1};  // 3 tokens, top-2, 8 experts over 2 ranks
  auto plan = plan_dispatch(ids, 3, 2, 8, 2);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_EQ(plan->by_rank[0].size(), 3u);
  EXPECT_EQ(plan->by_rank[0][1].token, 1);
  EXPECT_EQ(plan->by_rank[0][1].expert, 3);
  EXPECT_EQ(plan->send_counts(0, 0, 2), (std::vector<int64_t>{2, 2}));
  const int32_t wrong[] = {0, 9};
  EXPECT_FALSE(plan_dispatch(wrong, 1, 2, 8, 2).is_ok());
}

// A tiny checkpoint of `arch` written by make-model's writer.
class ParallelModel : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sy_dist_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
    auto config = model::preset_config(GetParam(), "tiny", 0);
    ASSERT_TRUE(config.is_ok()) << config.message();
    Status written =
        model::write_random_checkpoint(*config, nlohmann::json::object(), dir_.string(), 11, false);
    ASSERT_TRUE(written.is_ok()) << written.message();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  struct Outputs {
    std::vector<std::vector<float>> logits;    // per step
    std::vector<std::vector<int32_t>> routes;  // per step
  };
  // A 37-token prefill, then 5 decode steps, on `parallel.tensor_parallel` ranks (1: no
  // communicator). Every rank's logits and routes must equal rank 0's; rank 0's are returned.
  Status run(const ParallelConfig& parallel, Outputs& result, bool check_agreement = true) {
    const int n = parallel.tensor_parallel;
    std::vector<Outputs> per_rank(static_cast<size_t>(n));
    auto body = [&](Communicator* comm) -> Status {
      const int rank = comm ? comm->rank() : 0;
      auto backend = backend::make_cpu_backend({1});
      moe::ExpertsKernelRegistry registry;
      backend->register_kernels(registry);
      SY_ASSIGN(std::unique_ptr<model::Model> full, model::Model::load(dir_.string(), *backend));
      std::unique_ptr<model::Model> shard;
      if (comm) {
        SY_ASSIGN(shard, shard_model(*full, parallel, rank, *backend));
      }
      const model::Model& m = comm ? *shard : *full;
      SY_ASSIGN(moe::ExpertsKernel * kernel,
                registry.select("cpu-modular", {Device::kCpu, true, true}));
      model::Decoder decoder(*backend, model::KernelChoice{kernel, nullptr, 0}, 16);
      SY_TRY(decoder.allocate(m.config(), 8, {64, 1, 8, 64}));
      if (comm)
        decoder.set_all_reduce(
            [comm](Tensor& t) { return comm->all_reduce_sum(t.data, t.numel(), t.dtype); });
      const int64_t vocab = m.config().vocab_size;
      std::vector<int32_t> tokens;
      for (int i = 0; i < 42; ++i) tokens.push_back(500 + (i * 7919) % 3000);
      for (auto [from, to] : std::vector<std::pair<int, int>>{
               {0, 37}, {37, 38}, {38, 39}, {39, 40}, {40, 41}, {41, 42}}) {
        model::StepInputs in;
        for (int p = from; p < to; ++p) {
          in.token_ids.push_back(tokens[p]);
          in.positions.push_back(p);
          in.token_seq.push_back(0);
          in.slot_mapping.push_back(p);
          in.logits_rows.push_back(p - from);
        }
        in.num_seqs = 1;
        in.max_blocks_per_seq = (to + 15) / 16;
        for (int b = 0; b < in.max_blocks_per_seq; ++b) in.block_tables.push_back(b);
        in.capture_routes = true;
        model::StepOutputs out;
        SY_TRY(decoder.forward(m, in, out));
        SY_TRY(decoder.finish_step(m, out));
        if (comm && check_agreement)
          SY_TRY(check_routes_agree(*comm, out.routes, m.config().num_hidden_layers,
                                    m.config().experts_per_token));
        std::vector<float> logits(static_cast<size_t>((to - from) * vocab));
        backend->download(out.logits, logits.data());
        per_rank[rank].logits.push_back(std::move(logits));
        per_rank[rank].routes.push_back(out.routes);
      }
      return Status::ok();
    };
    Status status;
    if (n == 1) {
      status = body(nullptr);
    } else {
      LocalGroup group(n);
      status = group.run([&](Communicator& comm) { return body(&comm); });
    }
    if (!status.is_ok()) return status;
    for (int r = 1; r < n; ++r)
      if (per_rank[r].logits != per_rank[0].logits || per_rank[r].routes != per_rank[0].routes)
        return Status::errorf("rank {} ended with other logits or routes than rank 0", r);
    result = std::move(per_rank[0]);
    return Status::ok();
  }

  static void expect_same(const Outputs& reference, const Outputs& parallel,
                          const std::string& what) {
    ASSERT_EQ(reference.logits.size(), parallel.logits.size());
    double worst = 0.0, largest = 0.0;
    for (size_t s = 0; s < reference.logits.size(); ++s) {
      EXPECT_EQ(reference.routes[s], parallel.routes[s]) << what << ": routes differ at step " << s;
      ASSERT_EQ(reference.logits[s].size(), parallel.logits[s].size());
      for (size_t i = 0; i < reference.logits[s].size(); ++i) {
        worst = std::max(worst, std::abs(double(reference.logits[s][i]) - parallel.logits[s][i]));
        largest = std::max(largest, std::abs(double(reference.logits[s][i])));
      }
    }
    // The shards add the same products in another order (per-rank partial sums, then the
    // all-reduce): f32 rounding only.
    EXPECT_LE(worst, 1e-5 * std::max(1.0, largest)) << what << ": largest |logit| " << largest;
    RecordProperty(what + "_max_abs_logit_diff", fmt::format("{:.3g}", worst));
  }

  std::filesystem::path dir_;
};

TEST_P(ParallelModel, TensorAndExpertParallelMatchOneRank) {
  Outputs reference, tp2, tp2_ep, tp4_ep;
  Status status = run({1, false}, reference);
  ASSERT_TRUE(status.is_ok()) << status.message();
  status = run({2, false}, tp2);
  ASSERT_TRUE(status.is_ok()) << status.message();
  expect_same(reference, tp2, "tp2");
  status = run({2, true}, tp2_ep);
  ASSERT_TRUE(status.is_ok()) << status.message();
  expect_same(reference, tp2_ep, "tp2_ep");
  // The TP=2 run really was sharded: its logits are not TP=1's bit for bit everywhere.
  EXPECT_NE(reference.logits, tp2.logits)
      << "a TP=2 run identical to TP=1 bit for bit suggests nothing was split";
}

INSTANTIATE_TEST_SUITE_P(Families, ParallelModel,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"));

TEST(ParallelModelRefusals, OlmoeGptOssAndDeepSeekLatentAttentionAreNamed) {
  for (const char* arch : {"olmoe", "gpt_oss", "deepseek_v3"}) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("sy_dist_refuse_" + std::string(arch) + "_" + std::to_string(::getpid()));
    auto config = model::preset_config(arch, "tiny", 0);
    ASSERT_TRUE(config.is_ok());
    ASSERT_TRUE(
        model::write_random_checkpoint(*config, nlohmann::json::object(), dir.string(), 3, false)
            .is_ok());
    auto backend = backend::make_cpu_backend({1});
    auto full = model::Model::load(dir.string(), *backend);
    ASSERT_TRUE(full.is_ok()) << full.message();
    auto shard = shard_model(**full, {2, false}, 0, *backend);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(shard.is_ok()) << arch;
    EXPECT_EQ(shard.status().code(), ErrorCode::kUnsupported) << shard.message();
    EXPECT_NE(shard.message().find("tensor parallel"), std::string::npos) << shard.message();
  }
}

}  // namespace
}  // namespace sy::dist
