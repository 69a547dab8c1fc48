// `switchyard bench`: a serving load generator with `vllm bench serve`'s metrics, for any
// OpenAI-compatible server (and SGLang's /generate); optionally checks routed-expert payloads.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>

#include "cli/commands.h"
#include "loadgen/client.h"
#include "loadgen/dataset.h"
#include "loadgen/report.h"
#include "loadgen/stats.h"
#include "loadgen/tokenizer_codec.h"
#include "tokenizer/tokenizer.h"

namespace sy::cli {

namespace {

struct BenchArgs {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;
  std::string endpoint = "completions";
  std::string dataset = "random";
  std::string tokenizer_dir;
  int vocab_size = 0;
  std::string prompt_format = "auto";
  loadgen::RandomDatasetOptions random;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int max_concurrency = 0;
  bool ignore_eos = false;
  bool routed_experts = false;
  bool no_routed_experts = false;
  int route_layers = 0, route_top_k = 0, route_num_experts = 0;
  std::string result_file;
  bool save_detailed = false;
  std::string goodput;
  std::string percentiles = "90,99";
  double request_timeout_s = 600;
  bool no_progress = false;
  bool no_ready_check = false;
};

Result<double> parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double rate = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(rate > 0)) {
    return Status::errorf("--request-rate must be 'inf' or a number > 0, got '{}'", text);
  }
  return rate;
}

Result<std::vector<double>> parse_percentiles(const std::string& text) {
  std::vector<double> percentiles;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double p = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(p >= 0 && p <= 100)) {
      return Status::errorf("--metric-percentiles: '{}' is not a percentile in [0, 100]", item);
    }
    percentiles.push_back(p);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return percentiles;
}

// --tokenizer, or else --model when it names a folder with a tokenizer.json.
std::string tokenizer_folder(const BenchArgs& args) {
  if (!args.tokenizer_dir.empty()) return args.tokenizer_dir;
  if (!args.model.empty() && std::ifstream(args.model + "/tokenizer.json")) return args.model;
  return "";
}

int run_bench(const BenchArgs& args) {
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "switchyard bench: %s\n", status.message().c_str());
    return 1;
  };
  if (args.dataset != "random") {
    return fail(Status::errorf("--dataset '{}' is not supported; valid: random", args.dataset));
  }
  auto endpoint = loadgen::parse_endpoint(args.endpoint);
  if (!endpoint) return fail(endpoint.status());
  auto rate = parse_rate(args.request_rate);
  if (!rate) return fail(rate.status());
  auto percentiles = parse_percentiles(args.percentiles);
  if (!percentiles) return fail(percentiles.status());
  auto slo = loadgen::parse_goodput(args.goodput);
  if (!slo) return fail(slo.status());
  // Prompts need a vocabulary; a tokenizer also gives text prompts and output-token cross-checks.
  std::optional<tokenizer::Tokenizer> tokenizer;
  loadgen::TokenCodec codec;
  const std::string tokenizer_dir = tokenizer_folder(args);
  if (!tokenizer_dir.empty()) {
    auto loaded = tokenizer::Tokenizer::load(tokenizer_dir);
    if (!loaded) return fail(loaded.status().with_context("--tokenizer " + tokenizer_dir + ": "));
    tokenizer = std::move(loaded).value();
    codec = loadgen::make_token_codec(*tokenizer);
    if (args.vocab_size > 0 && args.vocab_size != codec.vocab_size) {
      return fail(Status::errorf("--vocab-size {} disagrees with the tokenizer's {}", args.vocab_size,
                                 codec.vocab_size));
    }
  } else {
    codec.vocab_size = args.vocab_size;
  }
  loadgen::RandomDatasetOptions dataset_options = args.random;
  if (args.prompt_format == "auto") {
    dataset_options.text_prompts = codec.can_text();
  } else if (args.prompt_format == "text" || args.prompt_format == "ids") {
    dataset_options.text_prompts = args.prompt_format == "text";
  } else {
    return fail(Status::errorf("--prompt-format '{}': valid: auto, text, ids", args.prompt_format));
  }
  if (*endpoint == loadgen::Endpoint::kChat && !dataset_options.text_prompts) {
    return fail(Status::error("--endpoint chat sends text prompts: give --tokenizer DIR"));
  }
  auto dataset = loadgen::make_random_dataset(dataset_options, codec);
  if (!dataset) return fail(dataset.status());

  loadgen::BenchConfig config;
  config.base_url = args.base_url;
  config.endpoint = *endpoint;
  config.text_prompts = dataset_options.text_prompts;
  config.request.model = args.model;
  config.request.ignore_eos = args.ignore_eos;
  config.request.routed_experts = args.routed_experts;
  config.request.routed_experts_off = args.no_routed_experts;
  if (args.routed_experts && args.no_routed_experts) {
    return fail(Status::error("--routed-experts and --no-routed-experts exclude each other"));
  }
  config.request_rate = *rate;
  config.burstiness = args.burstiness;
  config.max_concurrency = args.max_concurrency;
  config.seed = dataset_options.seed;
  config.request_timeout_s = args.request_timeout_s;
  config.progress = !args.no_progress && isatty(STDERR_FILENO);
  config.ready_check = !args.no_ready_check;
  if (args.route_layers > 0) config.route_expectation.layers = args.route_layers;
  if (args.route_top_k > 0) config.route_expectation.top_k = args.route_top_k;
  if (args.route_num_experts > 0) config.route_expectation.num_experts = args.route_num_experts;

  // The model card names the model (when --model is not given) and, from Switchyard, the layout
  // routes must have; flags given explicitly win.
  const bool need_model = config.request.model.empty() && config.endpoint != loadgen::Endpoint::kGenerate;
  if (need_model || config.request.routed_experts) {
    auto card = loadgen::fetch_first_model(config.base_url, 30);
    if (!card && need_model) return fail(card.status());
    if (card) {
      if (need_model) config.request.model = card->id;
      auto& expectation = config.route_expectation;
      if (!expectation.layers) expectation.layers = card->num_hidden_layers;
      if (!expectation.top_k) expectation.top_k = card->top_k;
      if (!expectation.num_experts) expectation.num_experts = card->num_experts;
    }
  }

  std::printf("Endpoint: %s%s  model: %s\n", config.base_url.c_str(),
              std::string(loadgen::endpoint_path(config.endpoint)).c_str(), config.request.model.c_str());
  std::printf("Random dataset: %d prompts, input_len in [%d, %d], output_len in [%d, %d], %s prompts\n",
              dataset_options.num_prompts, dataset->input_len_low + dataset_options.prefix_len,
              dataset->input_len_high + dataset_options.prefix_len, dataset->output_len_low,
              dataset->output_len_high, config.text_prompts ? "text" : "token-id");
  std::printf("Traffic request rate: %s\nBurstiness factor: %g (%s)\nMaximum request concurrency: %s\n",
              args.request_rate.c_str(), args.burstiness,
              args.burstiness == 1.0 ? "Poisson process" : "Gamma distribution",
              args.max_concurrency > 0 ? std::to_string(args.max_concurrency).c_str() : "None");
  std::fflush(stdout);

  auto run = loadgen::run_benchmark(config, dataset->requests);
  if (!run) return fail(run.status());

  loadgen::TokenCounter counter;  // only with a tokenizer; without one vLLM counts 1
  long long tokenizer_output_tokens = -1;
  int tokenizer_output_mismatch = 0;
  if (tokenizer) {
    counter = [&tokenizer](const std::string& text) {
      return loadgen::count_output_tokens(*tokenizer, text);
    };
    tokenizer_output_tokens = 0;
    for (const loadgen::RequestOutput& output : run->outputs) {
      if (!output.success) continue;
      const int counted = counter(output.generated_text);
      tokenizer_output_tokens += counted;
      tokenizer_output_mismatch += output.output_tokens > 0 && counted != output.output_tokens;
    }
  }
  loadgen::ReportContext context;
  context.endpoint = std::string(loadgen::endpoint_name(config.endpoint));
  context.model = config.request.model;
  context.base_url = config.base_url;
  context.tokenizer = tokenizer_dir;
  context.tokenizer_output_tokens = tokenizer_output_tokens;
  context.tokenizer_output_mismatch = tokenizer_output_mismatch;
  context.num_prompts = dataset_options.num_prompts;
  context.request_rate = config.request_rate;
  context.burstiness = config.burstiness;
  context.max_concurrency = config.max_concurrency;
  context.percentiles = *percentiles;
  context.goodput = slo->any();
  context.routed_experts = config.request.routed_experts;
  const loadgen::BenchmarkMetrics metrics =
      loadgen::compute_metrics(run->outputs, run->duration_s, *percentiles, *slo, counter);

  for (size_t i = 0, shown = 0; i < run->outputs.size() && shown < 10; ++i) {
    if (!run->outputs[i].success) {
      if (shown++ == 0) std::printf("Failed requests (first 10):\n");
      std::printf("  request %zu: %s\n", i, run->outputs[i].error.c_str());
    }
  }
  std::fputs(loadgen::format_report(context, metrics, *run).c_str(), stdout);
  if (!args.result_file.empty()) {
    std::ofstream file(args.result_file);
    file << loadgen::report_json(context, metrics, *run, args.save_detailed).dump(2) << "\n";
    if (!file) return fail(Status::errorf("cannot write --result-file {}", args.result_file));
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  auto* command = app.add_subcommand(
      "bench", "Load-test an OpenAI-compatible server (vllm bench serve's metrics)");
  command->add_option("--base-url", args->base_url, "Server base URL (http://HOST:PORT)")->capture_default_str();
  command->add_option("--model", args->model, "Model name to send (default: first of /v1/models)");
  command->add_option("--endpoint", args->endpoint, "completions | chat | generate (SGLang)")->capture_default_str();
  command->add_option("--dataset", args->dataset, "Dataset (random)")->capture_default_str();
  command->add_option("--tokenizer", args->tokenizer_dir, "Tokenizer folder (tokenizer.json): text prompts, token cross-checks");
  command->add_option("--vocab-size", args->vocab_size, "Vocabulary size for token-id prompts without --tokenizer");
  command->add_option("--prompt-format", args->prompt_format, "auto | text | ids")->capture_default_str();
  command->add_option("--input-len", args->random.input_len, "Mean input length (tokens)")->capture_default_str();
  command->add_option("--output-len", args->random.output_len, "Mean output length (tokens)")->capture_default_str();
  command->add_option("--range-ratio", args->random.range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")->capture_default_str();
  command->add_option("--prefix-len", args->random.prefix_len, "Shared random prefix (tokens)")->capture_default_str();
  command->add_option("--num-prompts", args->random.num_prompts, "Requests to send")->capture_default_str();
  command->add_option("--seed", args->random.seed, "Seed for the dataset and the arrival times")->capture_default_str();
  command->add_option("--request-rate", args->request_rate, "inf or requests/s (Poisson arrivals)")->capture_default_str();
  command->add_option("--burstiness", args->burstiness, "Gamma shape of the arrival gaps (1 = Poisson)")->capture_default_str();
  command->add_option("--max-concurrency", args->max_concurrency, "Cap on requests in flight (0: none)")->capture_default_str();
  command->add_flag("--ignore-eos", args->ignore_eos, "Ask the server to ignore EOS");
  command->add_flag("--routed-experts", args->routed_experts, "Ask for routed experts and check every payload");
  command->add_flag("--no-routed-experts", args->no_routed_experts,
                    "Send return_routed_experts: false (the \"off\" side of an A/B)");
  command->add_option("--route-layers", args->route_layers, "Expected L of the routes (0: any, consistent)");
  command->add_option("--route-top-k", args->route_top_k, "Expected K of the routes (0: any, consistent)");
  command->add_option("--route-num-experts", args->route_num_experts, "Expert ids must be below this (0: unchecked)");
  command->add_option("--goodput", args->goodput, "SLOs in ms, e.g. \"ttft:500 tpot:50\"");
  command->add_option("--metric-percentiles", args->percentiles, "Comma-separated percentiles")->capture_default_str();
  command->add_option("--result-file", args->result_file, "Write the result as JSON here");
  command->add_flag("--save-detailed", args->save_detailed, "Include per-request arrays in the result file");
  command->add_option("--request-timeout", args->request_timeout_s, "Seconds before a request is abandoned")->capture_default_str();
  command->add_flag("--no-progress", args->no_progress, "No progress bar");
  command->add_flag("--no-ready-check", args->no_ready_check, "Skip the single request sent first");
  command->callback([args, &exit_code] { exit_code = run_bench(*args); });
}

}  // namespace sy::cli
