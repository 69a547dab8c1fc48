// `switchyard inspect DIR`: validates the whole checkpoint (every file, tensor and shape the
// architecture needs) and prints architecture, parameters, MoE layers, tensors, dtypes, bytes.
#include <cstdio>
#include <map>

#include "backend/backend.h"
#include "cli/commands.h"
#include "model/model.h"

namespace sy::cli {

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto model_dir = std::make_shared<std::string>();
  auto list_tensors = std::make_shared<bool>(false);
  auto* command = app.add_subcommand("inspect", "Validate a checkpoint and describe it");
  command->add_option("model", *model_dir, "Model folder")->required();
  command->add_flag("--tensors", *list_tensors, "List every tensor");
  command->callback([model_dir, list_tensors, &exit_code] {
    auto backend = backend::make_cpu_backend({1});
    auto loaded = model::Model::load(*model_dir, *backend);
    if (!loaded) {
      std::fprintf(stderr, "inspect: %s\n", loaded.message().c_str());
      exit_code = 1;
      return;
    }
    const model::Model& m = **loaded;
    const model::ModelConfig& c = m.config();
    auto checkpoint = model::Checkpoint::open(*model_dir);
    std::map<std::string, std::pair<int64_t, uint64_t>> by_dtype;
    for (const auto& tensor : checkpoint->tensors()) {
      auto& entry = by_dtype[std::string(dtype_name(tensor.dtype))];
      ++entry.first;
      entry.second += tensor.nbytes;
    }
    std::printf("architecture: %s (model_type %s)\n", c.architecture.c_str(), c.model_type.c_str());
    std::printf("parameters: %lld (%.3f B)\n", static_cast<long long>(m.parameter_count()), m.parameter_count() / 1e9);
    std::printf("layers: %lld, hidden %lld, heads %lld (kv %lld, head_dim %lld), vocab %lld\n",
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
                static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size));
    std::string moe_layers;
    for (int layer : c.moe_layers()) moe_layers += (moe_layers.empty() ? "" : ",") + std::to_string(layer);
    std::printf("moe_layers: [%s]\n", moe_layers.c_str());
    std::printf("experts: %lld, top_k %lld, norm_topk_prob %s, moe_intermediate %lld\n",
                static_cast<long long>(c.num_experts), static_cast<long long>(c.experts_per_token),
                c.norm_topk_prob ? "true" : "false", static_cast<long long>(c.moe_intermediate_size));
    std::printf("files: %zu, tensors: %zu, bytes: %llu\n", checkpoint->files().size(), checkpoint->tensors().size(),
                static_cast<unsigned long long>(checkpoint->total_bytes()));
    for (const auto& [dtype, entry] : by_dtype)
      std::printf("  %s: %lld tensors, %llu bytes\n", dtype.c_str(), static_cast<long long>(entry.first),
                  static_cast<unsigned long long>(entry.second));
    if (*list_tensors)
      for (const auto& tensor : checkpoint->tensors()) {
        std::string shape;
        for (int64_t d : tensor.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        std::printf("%s %s [%s]\n", tensor.name.c_str(), std::string(dtype_name(tensor.dtype)).c_str(), shape.c_str());
      }
    std::printf("ok: checkpoint is valid\n");
  });
}

}  // namespace sy::cli
