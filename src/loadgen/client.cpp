#include "loadgen/client.h"

#include <sys/resource.h>
#include <unistd.h>

#include <utility>  // before asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>

#include "loadgen/sse.h"

namespace sy::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

Result<BaseUrl> parse_base_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind("https://", 0) == 0) {
    return Status::errorf("--base-url {}: https is not supported; use http://", url);
  }
  if (url.rfind(kScheme, 0) != 0) {
    return Status::errorf("--base-url '{}' must start with http://", url);
  }
  std::string rest = url.substr(kScheme.size());
  BaseUrl parsed;
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) {
    parsed.path_prefix = rest.substr(slash);
    while (!parsed.path_prefix.empty() && parsed.path_prefix.back() == '/') {
      parsed.path_prefix.pop_back();
    }
  }
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    parsed.host = authority.substr(0, colon);
    parsed.port = authority.substr(colon + 1);
  } else {
    parsed.host = authority;
    parsed.port = "80";
  }
  if (parsed.host.empty()) return Status::errorf("--base-url '{}' has no host", url);
  if (parsed.port.empty() ||
      parsed.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stol(parsed.port) < 1 || std::stol(parsed.port) > 65535) {
    return Status::errorf("--base-url '{}': port must be 1..65535", url);
  }
  return parsed;
}

namespace {
double process_cpu_s() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& time) { return time.tv_sec + time.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}
}  // namespace

long raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<long>(limit.rlim_cur);
}

namespace {

constexpr auto kUseAwaitable = asio::use_awaitable;

// A counting semaphore for coroutines on one thread: a waiter parks on a timer that release()
// cancels, handing its slot over directly.
class AsyncSemaphore {
 public:
  AsyncSemaphore(asio::any_io_executor executor, int count)
      : executor_(std::move(executor)), count_(count) {}
  asio::awaitable<void> acquire() {
    if (count_ > 0) {
      --count_;
      co_return;
    }
    auto timer = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    waiters_.push_back(timer);
    boost::system::error_code ignored;
    co_await timer->async_wait(asio::redirect_error(kUseAwaitable, ignored));
  }
  void release() {
    if (waiters_.empty()) {
      ++count_;
      return;
    }
    waiters_.front()->cancel();
    waiters_.pop_front();
  }

 private:
  asio::any_io_executor executor_;
  int count_;
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;
};

struct Connection {
  explicit Connection(asio::any_io_executor executor) : stream(std::move(executor)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool reused = false;
};

struct Attempt {
  RequestOutput output;
  int choice_chunks = 0;
  bool retry_on_fresh_connection = false;  // a reused keep-alive connection was already closed
  std::optional<int> usage_prompt_tokens, usage_completion_tokens;
  std::optional<std::string> routes;
};

class Runner {
 public:
  Runner(const BenchConfig& config, BaseUrl url, const std::vector<DatasetRequest>& requests)
      : config_(config), url_(std::move(url)), requests_(requests) {
    target_ = url_.path_prefix + std::string(endpoint_path(config.endpoint));
    host_header_ = url_.host + ":" + url_.port;
  }

  Status prepare() {
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    endpoints_ = resolver.resolve(url_.host, url_.port, ec);
    if (ec) return Status::errorf("cannot resolve {}:{}: {}", url_.host, url_.port, ec.message());
    bodies_.reserve(requests_.size());
    for (const DatasetRequest& request : requests_) {
      SY_ASSIGN(std::string body,
                build_request_body(config_.endpoint, request, config_.text_prompts, config_.request));
      bodies_.push_back(std::move(body));
    }
    return Status::ok();
  }

  // One request alone, before the measured run.
  Status ready_check() {
    Attempt result;
    start_ = Clock::now();
    asio::co_spawn(io_, perform(0, result), asio::detached);
    io_.run();
    io_.restart();
    if (!result.output.success) {
      return Status::errorf("the ready-check request to {}{} failed: {}", host_header_, target_,
                            result.output.error);
    }
    return Status::ok();
  }

  RunResult run() {
    RunResult result;
    const size_t count = requests_.size();
    attempts_.assign(count, Attempt{});
    arrivals_ = arrival_times_s(static_cast<int>(count), config_.request_rate, config_.burstiness,
                                config_.seed);
    if (config_.max_concurrency > 0) {
      semaphore_.emplace(io_.get_executor(), config_.max_concurrency);
    }
    const double cpu_before_s = process_cpu_s();
    start_ = Clock::now();
    asio::co_spawn(io_, dispatch(), asio::detached);
    if (config_.progress) asio::co_spawn(io_, show_progress(), asio::detached);
    io_.run();
    result.duration_s = seconds_since_start();
    result.client_cpu_s = process_cpu_s() - cpu_before_s;
    if (config_.progress) print_progress(/*final=*/true);
    idle_.clear();

    for (size_t i = 0; i < count; ++i) {
      Attempt& attempt = attempts_[i];
      RequestOutput& output = attempt.output;
      if (output.success) {
        if (!attempt.usage_completion_tokens) ++result.usage_missing;
        // Chat prompts gain the chat template on the server, so only raw prompts compare.
        if (config_.endpoint != Endpoint::kChat && attempt.usage_prompt_tokens &&
            *attempt.usage_prompt_tokens != requests_[i].prompt_len) {
          ++result.prompt_len_mismatch;
        }
        if (config_.request.routed_experts) check_routes(i, attempt, result.routes);
      }
      result.choice_chunks.push_back(attempt.choice_chunks);
      result.outputs.push_back(std::move(output));
    }
    result.peak_open_streams = peak_open_;
    return result;
  }

 private:
  double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

  asio::awaitable<void> dispatch() {
    asio::steady_timer timer(io_);
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (arrivals_[i] > 0) {
        timer.expires_at(start_ + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(arrivals_[i])));
        boost::system::error_code ignored;
        co_await timer.async_wait(asio::redirect_error(kUseAwaitable, ignored));
      }
      asio::co_spawn(io_, request_task(i), asio::detached);
    }
  }

  asio::awaitable<void> request_task(size_t index) {
    if (semaphore_) co_await semaphore_->acquire();
    co_await perform(index, attempts_[index]);
    if (semaphore_) semaphore_->release();
    ++completed_;
  }

  asio::awaitable<void> perform(size_t index, Attempt& result) {
    ++open_;
    peak_open_ = std::max(peak_open_, open_);
    const double start_s = seconds_since_start();
    try {
      for (int attempt = 0; attempt < 2; ++attempt) {
        result = Attempt{};
        result.output.start_time_s = start_s;
        co_await exchange(index, result);
        if (!result.retry_on_fresh_connection) break;
      }
    } catch (const std::exception& e) {
      result.output.success = false;
      result.output.error = std::string("client exception: ") + e.what();
    }
    --open_;
  }

  asio::awaitable<std::unique_ptr<Connection>> take_connection(boost::system::error_code& ec) {
    if (!idle_.empty()) {
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      co_return connection;
    }
    auto connection = std::make_unique<Connection>(io_.get_executor());
    connection->stream.expires_after(timeout());
    co_await connection->stream.async_connect(endpoints_, asio::redirect_error(kUseAwaitable, ec));
    if (!ec) connection->stream.socket().set_option(tcp::no_delay(true), ec);
    co_return connection;
  }

  std::chrono::steady_clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(config_.request_timeout_s));
  }

  asio::awaitable<void> exchange(size_t index, Attempt& result) {
    RequestOutput& output = result.output;
    output.prompt_tokens = requests_[index].prompt_len;
    boost::system::error_code ec;
    std::unique_ptr<Connection> connection = co_await take_connection(ec);
    if (ec) {
      output.error = fmt::format("connect to {}: {}", host_header_, ec.message());
      co_return;
    }
    const bool reused = connection->reused;
    beast::tcp_stream& stream = connection->stream;
    stream.expires_after(timeout());

    http::request<http::string_body> request{http::verb::post, target_, 11};
    request.set(http::field::host, host_header_);
    request.set(http::field::content_type, "application/json");
    request.set(http::field::accept, "text/event-stream");
    request.keep_alive(true);
    request.body() = bodies_[index];
    request.prepare_payload();
    co_await http::async_write(stream, request, asio::redirect_error(kUseAwaitable, ec));
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) {
      co_await http::async_read_header(stream, connection->buffer, parser,
                                       asio::redirect_error(kUseAwaitable, ec));
    }
    if (ec) {
      // A keep-alive connection the server has since closed fails before any response byte.
      result.retry_on_fresh_connection = reused;
      output.error = fmt::format("sending the request: {}", ec.message());
      co_return;
    }

    const unsigned status = parser.get().result_int();
    SseParser sse;
    StreamReader reader(config_.endpoint);
    std::string error_body;
    bool first_chunk = false, stream_error = false;
    double last_chunk_s = output.start_time_s;
    auto take_event = [&](const SseEvent& event, double now_s) {
      if (stream_error) return;
      Result<bool> carries_choice = reader.on_data(event.data);
      if (!carries_choice) {
        output.error = carries_choice.message();
        stream_error = true;
        return;
      }
      if (!*carries_choice) return;
      if (!first_chunk) {
        first_chunk = true;
        output.ttft_s = now_s - output.start_time_s;
      } else {
        output.itl_s.push_back(now_s - last_chunk_s);
      }
      last_chunk_s = now_s;
    };

    char piece[16 * 1024];
    while (!parser.is_done() && !stream_error) {
      parser.get().body().data = piece;
      parser.get().body().size = sizeof piece;
      co_await http::async_read_some(stream, connection->buffer, parser,
                                     asio::redirect_error(kUseAwaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      const size_t received = sizeof piece - parser.get().body().size;
      if (received > 0) {
        const double now_s = seconds_since_start();
        if (status != 200) {
          if (error_body.size() < 2000) error_body.append(piece, std::min<size_t>(received, 2000));
        } else {
          for (const SseEvent& event : sse.feed(std::string_view(piece, received))) {
            take_event(event, now_s);
          }
        }
      }
      if (ec) break;
    }
    if (status == 200 && !stream_error) {
      const double now_s = seconds_since_start();
      for (const SseEvent& event : sse.finish()) take_event(event, now_s);
    }

    const bool complete = !ec && parser.is_done();
    if (complete && !stream_error && parser.keep_alive() && connection->buffer.size() == 0) {
      connection->reused = true;
      stream.expires_never();
      idle_.push_back(std::move(connection));
    } else {
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream.close();
    }

    if (status != 200) {
      output.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 500));
      co_return;
    }
    if (stream_error) co_return;
    if (!complete) {
      output.error = fmt::format("stream ended early: {}", ec ? ec.message() : "incomplete");
      co_return;
    }
    if (!first_chunk) {
      output.error = "the stream carried no chunk with a choice (no first token to time)";
      co_return;
    }
    output.success = true;
    output.latency_s = last_chunk_s - output.start_time_s;
    output.generated_text = reader.text();
    result.choice_chunks = reader.choice_chunks();
    result.usage_prompt_tokens = reader.prompt_tokens();
    result.usage_completion_tokens = reader.completion_tokens();
    if (reader.prompt_tokens()) output.prompt_tokens = *reader.prompt_tokens();
    if (reader.completion_tokens()) output.output_tokens = *reader.completion_tokens();
    result.routes = reader.routed_experts();
  }

  void check_routes(size_t index, const Attempt& attempt, RouteReport& report) {
    ++report.checked;
    auto fail = [&](const std::string& why) {
      ++report.failed;
      if (report.first_errors.size() < 5) {
        report.first_errors.push_back(fmt::format("request {}: {}", index, why));
      }
    };
    if (!attempt.routes) return fail("no routed_experts in the response");
    if (!attempt.usage_prompt_tokens || !attempt.usage_completion_tokens) {
      return fail("no usage counts, so N (prompt + completion tokens) is unknown");
    }
    const int64_t rows = int64_t{*attempt.usage_prompt_tokens} + *attempt.usage_completion_tokens - 1;
    RouteExpectation expectation = config_.route_expectation;
    if (report.layout) {  // every request must agree with the first good one
      expectation.layers = expectation.layers.value_or(report.layout->layers);
      expectation.top_k = expectation.top_k.value_or(report.layout->top_k);
    }
    Result<RouteShape> shape = config_.endpoint == Endpoint::kGenerate
                                   ? check_flat_routes(*attempt.routes, std::max<int64_t>(rows, 0), expectation)
                                   : check_npy_routes(*attempt.routes, std::max<int64_t>(rows, 0), expectation);
    if (!shape) return fail(shape.message());
    if (!report.layout && shape->rows > 0) report.layout = *shape;
  }

  asio::awaitable<void> show_progress() {
    asio::steady_timer timer(io_);
    while (completed_ < requests_.size()) {
      print_progress(false);
      timer.expires_after(std::chrono::milliseconds(200));
      co_await timer.async_wait(kUseAwaitable);
    }
  }

  void print_progress(bool final) {
    const size_t total = requests_.size();
    constexpr int kWidth = 40;
    const int filled = total ? static_cast<int>(kWidth * completed_ / total) : kWidth;
    std::fprintf(stderr, "\r%3d%% [%s%s] %zu/%zu  %.1f s  in flight %d ",
                 total ? static_cast<int>(100 * completed_ / total) : 100,
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), completed_, total,
                 seconds_since_start(), open_);
    if (final) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

  const BenchConfig& config_;
  BaseUrl url_;
  const std::vector<DatasetRequest>& requests_;
  std::string target_, host_header_;
  std::vector<std::string> bodies_;
  asio::io_context io_;
  tcp::resolver::results_type endpoints_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::optional<AsyncSemaphore> semaphore_;
  std::vector<Attempt> attempts_;
  std::vector<double> arrivals_;
  Clock::time_point start_;
  size_t completed_ = 0;
  int open_ = 0, peak_open_ = 0;
};

}  // namespace

Result<RunResult> run_benchmark(const BenchConfig& config,
                                const std::vector<DatasetRequest>& requests) {
  if (requests.empty()) return Status::error("no requests to send");
  if (!(config.request_rate > 0)) {
    return Status::errorf("--request-rate must be > 0 or inf, got {}", config.request_rate);
  }
  if (!(config.burstiness > 0)) {
    return Status::errorf("--burstiness must be > 0, got {}", config.burstiness);
  }
  if (config.max_concurrency < 0) {
    return Status::errorf("--max-concurrency must be >= 1, got {}", config.max_concurrency);
  }
  SY_ASSIGN(BaseUrl url, parse_base_url(config.base_url));
  raise_fd_limit();
  Runner runner(config, std::move(url), requests);
  SY_TRY(runner.prepare());
  if (config.ready_check) SY_TRY(runner.ready_check());
  return runner.run();
}

Result<ModelCard> fetch_first_model(const std::string& base_url, double timeout_s) {
  SY_ASSIGN(BaseUrl url, parse_base_url(base_url));
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(url.host, url.port, ec);
  if (ec) return Status::errorf("cannot resolve {}:{}: {}", url.host, url.port, ec.message());
  stream.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
  http::response<http::string_body> response;
  const std::string target = url.path_prefix + "/v1/models";
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await stream.async_connect(endpoints, asio::redirect_error(kUseAwaitable, ec));
        if (ec) co_return;
        http::request<http::empty_body> request{http::verb::get, target, 11};
        request.set(http::field::host, url.host + ":" + url.port);
        co_await http::async_write(stream, request, asio::redirect_error(kUseAwaitable, ec));
        if (ec) co_return;
        beast::flat_buffer buffer;
        co_await http::async_read(stream, buffer, response, asio::redirect_error(kUseAwaitable, ec));
      },
      asio::detached);
  io.run();
  if (ec) return Status::errorf("GET {}{}: {}", base_url, "/v1/models", ec.message());
  if (response.result_int() != 200) {
    return Status::errorf("GET {}/v1/models: HTTP {}", base_url, response.result_int());
  }
  auto models = nlohmann::json::parse(response.body(), nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") ||
      !models["data"][0]["id"].is_string()) {
    return Status::errorf("GET {}/v1/models: no model listed; pass --model NAME", base_url);
  }
  const nlohmann::json& first = models["data"][0];
  ModelCard card;
  card.id = first["id"].get<std::string>();
  auto number = [&first](const char* key) -> std::optional<int64_t> {
    auto it = first.find(key);
    if (it == first.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  card.num_hidden_layers = number("num_hidden_layers");
  card.top_k = number("top_k");
  card.num_experts = number("num_experts");
  return card;
}

}  // namespace sy::loadgen
