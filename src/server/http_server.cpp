// The HTTP layer: Boost.Beast parsing on Asio, one strand per connection, responses written as
// raw HTTP/1.1 (fixed-length JSON, or chunked SSE). Engine callbacks run on the engine thread;
// they only detokenize, check stop strings and post to the connection's strand.
//
// A closed connection is noticed by a read-readiness wait kept on the socket while a request is
// in flight (a peek tells EOF from pipelined bytes), so non-streaming requests are cancelled too.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/api.h"
#include "server/metrics.h"
#include "server/route_store.h"
#include "server/server.h"
#include "server/ui.h"

namespace sy::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(300);
constexpr auto kBodyTimeout = std::chrono::seconds(300);
constexpr auto kWriteTimeout = std::chrono::seconds(120);

std::string random_hex(size_t length) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string out(length, '0');
  for (char& c : out) c = digits[rng() & 15];
  return out;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// `extra_headers`: whole header lines, each ending in \r\n.
std::string http_head(int status, std::string_view content_type, size_t content_length,
                      bool keep_alive, bool chunked, std::string_view extra_headers = "") {
  std::string head = fmt::format("HTTP/1.1 {} {}\r\n", status,
                                 std::string(http::obsolete_reason(http::int_to_status(status))));
  head += "Server: switchyard\r\n";
  head += extra_headers;
  if (!content_type.empty()) head += fmt::format("Content-Type: {}\r\n", content_type);
  if (chunked) {
    head += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  } else {
    head += fmt::format("Content-Length: {}\r\n", content_length);
  }
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

std::string http_chunk(std::string_view data) {
  return fmt::format("{:x}\r\n", data.size()) + std::string(data) + "\r\n";
}

std::string sse_event(const json& value) {
  return "data: " + dump_json(value) + "\n\n";
}

// What the engine thread hands to the strand for one event of one choice.
struct ChoiceUpdate {
  size_t choice = 0;
  std::string text;  // safe to emit
  std::vector<int32_t> token_ids;
  std::vector<engine::TokenLogprob> logprobs;
  std::vector<engine::TokenLogprob> prompt_logprobs;
  int64_t cached_prompt_tokens = 0;
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  std::optional<int32_t> stop_token_id;
  std::string matched_stop;
  std::shared_ptr<const moe::RouteArray> routes;  // the engine's, shared: no copy on its thread
  // stream_routed_experts: the event's new rows (all layers as the engine gave them; on the
  // strand, replaced by the selected rows the chunk carries).
  std::optional<moe::RouteArray> new_routes;
  Status error;
  Clock::time_point at;
};

struct ChoiceSlot {
  std::unique_ptr<ChoiceText> text;  // engine thread only
  // Strand only from here on.
  engine::RequestId engine_id = 0;
  bool submitted = false;
  bool finished = false;
  bool sent_first = false;
  int64_t streamed_text_bytes = 0;
  Clock::time_point first_token_at{};
  ChoiceResult result;
  // For the UI's route store: every row, all layers, whatever the request asked for.
  std::optional<moe::RouteArray> stored_routes;
};

}  // namespace

struct Job;
class Session;

struct Server::Impl {
  explicit Impl(ServerConfig c) : config(std::move(c)), acceptor(ioc), signals(ioc) {
    if (config.ui && config.enable_return_routed_experts && config.ui_route_store_requests > 0) {
      route_store =
          std::make_unique<RouteStore>(config.ui_route_store_requests, config.ui_route_store_bytes);
    }
  }

  ServerConfig config;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::signal_set signals;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  net::thread_pool blocking{1};  // weight updates and cache flushes: never on an I/O thread

  std::atomic<engine::Engine*> engine{nullptr};
  std::atomic<const TextCodec*> codec{nullptr};
  engine::ModelInfo model;  // written once in attach(), before `engine` is published
  std::atomic<bool> draining{false};
  std::atomic<int64_t> jobs_alive{0};
  ServerMetrics metrics;
  std::unique_ptr<RouteStore> route_store;  // null unless --ui with capture on

  std::mutex jobs_mutex;
  std::unordered_map<std::string, std::weak_ptr<Job>> jobs_by_id;

  std::mutex state_mutex;
  std::condition_variable state_cv;
  bool drained = false;
  bool stopped = false;

  void accept();
  void register_job(const std::shared_ptr<Job>& job);
  void unregister_job(const Job& job);
  void abort_job(const std::shared_ptr<Job>& job);
  void abort_all();
  void poll_drain(std::shared_ptr<net::steady_timer> timer, Clock::time_point deadline);
  void finish_drain();
  void stop_now();
};

// One API request in flight: prompts x n engine requests.
struct Job {
  Job(Server::Impl& s, ApiRequest r) : server(s), request(std::move(r)) { ++server.jobs_alive; }
  ~Job() {
    server.unregister_job(*this);
    --server.jobs_alive;
  }
  Server::Impl& server;
  ApiRequest request;
  std::string id;
  std::vector<std::string> registered_names;
  int64_t created = 0;
  Clock::time_point arrival;
  std::vector<ChoiceSlot> choices;
  size_t finished_count = 0;
  bool cancelled = false;
  bool done = false;
  std::optional<ApiError> failure;
  std::weak_ptr<Session> session;
  std::function<void(std::function<void()>)> post_to_session;  // runs on the session's strand
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server::Impl& server) : stream_(std::move(socket)), server_(server) {}
  ~Session() { cancel_job(); }

  void run() {
    beast::error_code ec;
    stream_.socket().non_blocking(true, ec);
    stream_.socket().set_option(tcp::no_delay(true), ec);
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  // Called on this session's strand.
  void on_update(const std::shared_ptr<Job>& job, ChoiceUpdate& update);
  void abort(const std::shared_ptr<Job>& job);

 private:
  void read_header();
  void on_header(beast::error_code ec);
  void on_body(beast::error_code ec);
  void handle(http::request<http::string_body> request);
  void handle_generation(const http::request<http::string_body>& request, Endpoint endpoint);
  void handle_tokenize(const json& body);
  void handle_detokenize(const json& body);
  void handle_abort(const json& body);
  void handle_blocking(std::function<Status(engine::Engine&)> work, std::string ok_message);
  void handle_ui(const http::request<http::string_body>& request, const std::string& path);
  void store_routes(const Job& job, const std::vector<ChoiceResult>& results);

  void send(int status, std::string_view content_type, std::string body,
            std::string_view extra_headers = "");
  void send_json(int status, const json& body) {
    send(status, "application/json", dump_json(body));
  }
  void send_error(const ApiError& error) { send_json(error.http_status, error_body(error)); }
  void send_error(int status, std::string message, std::string param = "") {
    send_error(ApiError{status, std::move(message), std::move(param)});
  }
  void enqueue(std::string data);
  void write_next();
  void after_response();
  void lingering_close();
  void discard_until_eof(std::shared_ptr<std::array<char, 65536>> scratch);
  void close();

  void watch_for_close();
  void cancel_job();
  void stream_update(Job& job, ChoiceSlot& slot, size_t index, const ChoiceUpdate& update);
  void finish_job(const std::shared_ptr<Job>& job);
  ResponseContext response_context(const Job& job) const {
    return ResponseContext{job.request,           server_.config, server_.model,
                           *server_.codec.load(), job.id,         job.created};
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server::Impl& server_;
  bool keep_alive_ = true;
  bool close_after_write_ = false;
  bool closed_ = false;
  bool responding_ = false;     // a response (or stream) is in progress
  bool response_done_ = false;  // the last bytes of it are queued
  bool writing_ = false;
  bool watching_ = false;
  std::deque<std::string> outbox_;
  std::shared_ptr<Job> job_;
};

// ---------------------------------------------------------------------------------------------
// Reading requests.

void Session::read_header() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(server_.config.max_header_bytes));
  parser_->body_limit(static_cast<std::uint64_t>(server_.config.max_request_bytes));
  stream_.expires_after(kIdleTimeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec == http::error::header_limit) {
    close_after_write_ = true;
    return send_error(
        431, fmt::format("request headers exceed {} bytes", server_.config.max_header_bytes));
  }
  if (ec == http::error::body_limit) {
    close_after_write_ = true;
    return send_error(413, fmt::format("request body exceeds --max-request-bytes ({} bytes)",
                                       server_.config.max_request_bytes));
  }
  if (ec) {
    if (ec != http::error::end_of_stream && ec != net::error::eof && ec != beast::error::timeout &&
        ec != net::error::operation_aborted && ec != net::error::connection_reset) {
      close_after_write_ = true;
      return send_error(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    return close();
  }
  auto& header = parser_->get();
  auto expect = header[http::field::expect];
  if (beast::iequals(expect, "100-continue")) {
    // Answer now so that a client like curl does not wait a second before sending the body.
    enqueue("HTTP/1.1 100 Continue\r\n\r\n");
  }
  stream_.expires_after(kBodyTimeout);
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    close_after_write_ = true;
    return send_error(413, fmt::format("request body exceeds --max-request-bytes ({} bytes)",
                                       server_.config.max_request_bytes));
  }
  if (ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    close_after_write_ = true;
    return send_error(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }
  stream_.expires_never();
  handle(parser_->release());
}

// ---------------------------------------------------------------------------------------------
// Routing.

void Session::handle(http::request<http::string_body> request) {
  keep_alive_ = request.keep_alive();
  responding_ = true;
  response_done_ = false;
  std::string target(request.target());
  std::string path = target.substr(0, target.find('?'));
  bool get = request.method() == http::verb::get;
  bool post = request.method() == http::verb::post;

  // The inspector page's files hold no data, and a browser cannot send a bearer header when it
  // navigates to a page: they are public; its data endpoints (/ui/api/) need the key like any.
  const bool ui_path = server_.config.ui && (path == "/ui" || path.starts_with("/ui/"));
  const bool public_path = path == "/health" || (ui_path && !path.starts_with("/ui/api/"));
  if (!server_.config.api_key.empty() && !public_path) {
    std::string expected = "Bearer " + server_.config.api_key;
    auto given = request[http::field::authorization];
    if (given != expected) {
      return send_error(
          401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'");
    }
  }

  if (ui_path) return handle_ui(request, path);

  struct Route {
    const char* path;
    bool get;
    bool post;
  };
  static const Route kRoutes[] = {
      {"/health", true, false},
      {"/v1/models", true, false},
      {"/metrics", true, false},
      {"/version", true, false},
      {"/v1/completions", false, true},
      {"/v1/chat/completions", false, true},
      {"/generate", false, true},
      {"/tokenize", false, true},
      {"/detokenize", false, true},
      {"/abort_request", false, true},
      {"/flush_cache", true, true},
      {"/update_weights_from_disk", false, true},
      {"/v1/embeddings", false, true},
      {"/v1/responses", false, true},
      {"/v1/audio/transcriptions", false, true},
      {"/pooling", false, true},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (path == r.path) route = &r;
  }
  if (!route) return send_error(404, fmt::format("route {} not found", path));
  if ((get && !route->get) || (post && !route->post) || (!get && !post)) {
    return send_error(405, fmt::format("method {} not allowed on {}",
                                       std::string(request.method_string()), path));
  }

  engine::Engine* engine = server_.engine.load();
  if (path == "/health") {
    if (!engine) return send_error(503, "model is loading");
    if (server_.draining) return send_error(503, "server is shutting down");
    return send(200, "", "");
  }
  if (path == "/version") return send_json(200, json{{"version", "switchyard 0.1.0"}});
  if (path == "/v1/embeddings" || path == "/v1/responses" || path == "/v1/audio/transcriptions" ||
      path == "/pooling") {
    return send_error(400, fmt::format("{} is not supported by this server", path));
  }
  if (!engine) return send_error(503, "model is loading; retry when /health answers 200");
  if (path == "/metrics") {
    return send(200, "text/plain; version=0.0.4",
                server_.metrics.render(server_.config.served_model_name, engine->metrics()));
  }
  if (path == "/v1/models")
    return send_json(200, models_response(server_.config, server_.model, unix_seconds()));

  if (server_.draining) return send_error(503, "server is shutting down");
  if (path == "/v1/completions") return handle_generation(request, Endpoint::kCompletions);
  if (path == "/v1/chat/completions") return handle_generation(request, Endpoint::kChat);
  if (path == "/generate") return handle_generation(request, Endpoint::kGenerate);
  if (path == "/flush_cache") {
    return handle_blocking([](engine::Engine& e) { return e.flush_cache(); }, "Cache flushed.");
  }

  ApiResult<json> body = parse_json_body(request.body());
  if (!body.is_ok()) return send_error(body.error);
  if (path == "/tokenize") return handle_tokenize(*body.value);
  if (path == "/detokenize") return handle_detokenize(*body.value);
  if (path == "/abort_request") return handle_abort(*body.value);
  if (path == "/update_weights_from_disk") {
    const json& b = *body.value;
    if (!b.contains("model_path") || !b["model_path"].is_string() ||
        b["model_path"].get<std::string>().empty()) {
      return send_error(400, "model_path is required: a directory with the new weights",
                        "model_path");
    }
    std::string model_path = b["model_path"].get<std::string>();
    return handle_blocking(
        [model_path](engine::Engine& e) { return e.update_weights_from_disk(model_path); },
        fmt::format("Succeeded to update model weights from {}.", model_path));
  }
  send_error(404, fmt::format("route {} not found", path));
}

void Session::handle_blocking(std::function<Status(engine::Engine&)> work, std::string ok_message) {
  engine::Engine* engine = server_.engine.load();
  auto executor = stream_.get_executor();
  net::post(server_.blocking, [self = shared_from_this(), engine, work = std::move(work), executor,
                               ok_message = std::move(ok_message)] {
    Status status = work(*engine);
    net::post(executor, [self, status, ok_message] {
      if (status) {
        self->send_json(200, json{{"success", true}, {"message", ok_message}});
      } else {
        ApiError error = api_error_from(status, "model_path");
        json body = error_body(error);
        body["success"] = false;
        body["message"] = status.message();
        self->send_json(error.http_status, body);
      }
    });
  });
}

void Session::handle_ui(const http::request<http::string_body>& request, const std::string& path) {
  if (request.method() != http::verb::get) {
    return send_error(405, fmt::format("method {} not allowed on {}",
                                       std::string(request.method_string()), path));
  }
  if (path == "/ui") return send(308, "", "", "Location: /ui/\r\n");
  constexpr std::string_view kApi = "/ui/api/";
  if (!path.starts_with(kApi)) {
    std::optional<UiFile> file = find_ui_file(path);
    if (!file) return send_error(404, fmt::format("route {} not found", path));
    return send(200, file->content_type, std::string(file->body),
                "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"
                "Content-Security-Policy: default-src 'self'; img-src 'self' data:; "
                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'\r\n");
  }
  engine::Engine* engine = server_.engine.load();
  if (!engine) return send_error(503, "model is loading; retry when /health answers 200");
  if (path == "/ui/api/expert_load") {
    return send_json(200, expert_load_json(server_.config, server_.model, engine->metrics(),
                                           server_.route_store.get()));
  }
  constexpr std::string_view kRoutes = "/ui/api/routes/";
  if (!path.starts_with(kRoutes)) return send_error(404, fmt::format("route {} not found", path));
  std::optional<std::string> id = percent_decode(std::string_view(path).substr(kRoutes.size()));
  if (!id)
    return send_error(400, "the request id in the path is not validly percent-encoded", "id");
  if (!server_.route_store) {
    return send_error(404,
                      "the route store is off: it keeps routes only when the server captures them "
                      "(--enable-return-routed-experts) and --ui-route-store is above 0",
                      "id");
  }
  std::optional<StoredRoutes> stored = server_.route_store->get(*id);
  if (!stored) {
    return send_error(404,
                      fmt::format("no routes stored for request id '{}': the route store keeps "
                                  "the last {} finished requests",
                                  *id, server_.route_store->max_requests()),
                      "id");
  }
  send_json(200, stored_routes_json(*stored, server_.config, server_.model, *server_.codec.load()));
}

void Session::handle_tokenize(const json& body) {
  const TextCodec& codec = *server_.codec.load();
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    // Reuse chat parsing so that the same template and options apply.
    json chat = body;
    chat.erase("model");
    chat["max_tokens"] = 1;
    engine::ModelInfo roomy = server_.model;
    roomy.max_model_len = INT32_MAX;  // tokenize does not care about the context length
    ParseContext roomy_context{server_.config, roomy, codec};
    ApiResult<ApiRequest> parsed = parse_chat_request(chat, roomy_context);
    if (!parsed.is_ok()) return send_error(parsed.error);
    ids = parsed.value->prompts[0].ids;
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool add_special = true;
    if (body.contains("add_special_tokens")) {
      if (!body["add_special_tokens"].is_boolean()) {
        return send_error(400, "add_special_tokens must be a boolean", "add_special_tokens");
      }
      add_special = body["add_special_tokens"].get<bool>();
    }
    Result<std::vector<int32_t>> encoded =
        codec.encode(body["prompt"].get<std::string>(), add_special);
    if (!encoded) return send_error(400, encoded.message(), "prompt");
    ids = std::move(encoded).value();
  } else {
    return send_error(400, "tokenize needs prompt (a string) or messages", "prompt");
  }
  json out = {
      {"count", ids.size()}, {"max_model_len", server_.model.max_model_len}, {"tokens", ids}};
  if (body.value("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(codec.token_text(id));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  send_json(200, out);
}

void Session::handle_detokenize(const json& body) {
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return send_error(400, "detokenize needs tokens: a list of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= server_.model.vocab_size) {
      return send_error(
          400,
          fmt::format("tokens: every id must be an integer in [0, {})", server_.model.vocab_size),
          "tokens");
    }
    ids.push_back(t.get<int32_t>());
  }
  send_json(200, json{{"prompt", server_.codec.load()->decode(ids, false)}});
}

void Session::handle_abort(const json& body) {
  bool all = body.value("abort_all", false);
  std::string rid =
      body.contains("rid") && body["rid"].is_string() ? body["rid"].get<std::string>() : "";
  if (!all && rid.empty())
    return send_error(400, "abort_request needs rid (a request id) or abort_all", "rid");
  if (all) {
    server_.abort_all();
    return send_json(200, json{{"success", true}});
  }
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(server_.jobs_mutex);
    auto it = server_.jobs_by_id.find(rid);
    if (it != server_.jobs_by_id.end()) job = it->second.lock();
  }
  if (!job) return send_error(404, fmt::format("no request in flight with id {}", rid), "rid");
  server_.abort_job(job);
  send_json(200, json{{"success", true}});
}

// ---------------------------------------------------------------------------------------------
// Generation.

void Session::handle_generation(const http::request<http::string_body>& http_request,
                                Endpoint endpoint) {
  ApiResult<json> body = parse_json_body(http_request.body());
  if (!body.is_ok()) return send_error(body.error);
  const TextCodec& codec = *server_.codec.load();
  ParseContext context{server_.config, server_.model, codec};
  ApiResult<ApiRequest> parsed =
      endpoint == Endpoint::kCompletions ? parse_completion_request(*body.value, context)
      : endpoint == Endpoint::kChat      ? parse_chat_request(*body.value, context)
                                         : parse_generate_request(*body.value, context);
  if (!parsed.is_ok()) return send_error(parsed.error);
  body.value.reset();  // a 64 MB replay body need not stay around while we generate

  auto job = std::make_shared<Job>(server_, std::move(*parsed.value));
  ApiRequest& request = job->request;
  if (request.rid.empty()) {
    auto header = http_request["X-Request-Id"];
    if (!header.empty()) request.rid = std::string(header);
  }
  const char* prefix = endpoint == Endpoint::kChat          ? "chatcmpl-"
                       : endpoint == Endpoint::kCompletions ? "cmpl-"
                                                            : "";
  job->id = endpoint == Endpoint::kGenerate && !request.rid.empty() ? request.rid
                                                                    : prefix + random_hex(32);
  job->created = unix_seconds();
  job->arrival = Clock::now();
  job->session = weak_from_this();
  auto executor = stream_.get_executor();
  std::weak_ptr<Session> weak = weak_from_this();
  job->post_to_session = [executor, weak](std::function<void()> work) {
    net::post(executor, [weak, work = std::move(work)] {
      if (auto self = weak.lock()) work();
    });
  };
  size_t total = request.prompts.size() * static_cast<size_t>(request.n);
  job->choices.resize(total);
  for (ChoiceSlot& slot : job->choices) {
    slot.text = std::make_unique<ChoiceText>(codec.stream(request.skip_special_tokens),
                                             request.stop, request.include_stop_str_in_output);
  }
  job_ = job;
  server_.register_job(job);

  engine::Engine& engine = *server_.engine.load();
  for (size_t i = 0; i < total; ++i) {
    engine::GenerationRequest generation;
    generation.prompt_ids = request.prompts[i / static_cast<size_t>(request.n)].ids;
    generation.sampling = request.sampling;
    if (request.sampling.seed) generation.sampling.seed = *request.sampling.seed + (i % request.n);
    generation.replay = request.replay;
    // The route store keeps every request's routes, asked for or not (the response still
    // carries them only when asked).
    generation.return_routes = request.routes.return_routes || server_.route_store != nullptr;
    generation.stream_routes = request.routes.return_routes && request.routes.stream;
    generation.return_route_weights = request.routes.return_routes && request.routes.weights;
    // Runs on the engine thread: detokenize, look for stop strings, hand off to the strand.
    auto callback = [job, i, weak](const engine::Event& event) {
      ChoiceSlot& slot = job->choices[i];
      auto update = std::make_shared<ChoiceUpdate>();
      update->choice = i;
      update->at = Clock::now();
      update->text = slot.text->push(event.new_token_ids);
      bool stop_now = slot.text->stopped() && !event.finished;
      if (event.finished) update->text += slot.text->finish();
      update->matched_stop = slot.text->matched_stop();
      update->token_ids = event.new_token_ids;
      update->logprobs = event.new_logprobs;
      update->prompt_logprobs = event.prompt_logprobs;
      update->cached_prompt_tokens = event.cached_prompt_tokens;
      update->finished = event.finished;
      update->finish_reason = event.finish_reason;
      update->stop_token_id = event.stop_token_id;
      update->routes = event.routes;
      if (event.new_routes)
        update->new_routes = *event.new_routes;  // a step's rows; the strand rewrites them
      update->error = event.error;
      job->post_to_session([weak, job, update] {
        if (auto self = weak.lock()) self->on_update(job, *update);
      });
      return stop_now ? engine::Continuation::kStop : engine::Continuation::kContinue;
    };
    Result<engine::RequestId> id = engine.submit(std::move(generation), std::move(callback));
    if (!id) {
      cancel_job();
      return send_error(api_error_from(id.status()));
    }
    job->choices[i].engine_id = *id;
    job->choices[i].submitted = true;
  }
  if (request.stream) {
    enqueue(http_head(200, "text/event-stream", 0, keep_alive_, true));
  }
  watch_for_close();
}

void Session::on_update(const std::shared_ptr<Job>& job, ChoiceUpdate& update) {
  if (job != job_ || job->cancelled || job->done) return;
  ChoiceSlot& slot = job->choices[update.choice];
  if (slot.finished) return;
  ChoiceResult& result = slot.result;
  if (!update.token_ids.empty() && slot.first_token_at == Clock::time_point{})
    slot.first_token_at = update.at;
  result.text += update.text;
  result.token_ids.insert(result.token_ids.end(), update.token_ids.begin(), update.token_ids.end());
  result.logprobs.insert(result.logprobs.end(), update.logprobs.begin(), update.logprobs.end());
  if (!update.prompt_logprobs.empty()) result.prompt_logprobs = std::move(update.prompt_logprobs);
  if (update.cached_prompt_tokens > 0) result.cached_prompt_tokens = update.cached_prompt_tokens;
  if (server_.route_store) {
    // Streamed pieces arrive in order; a gap (never expected) drops the choice from the store.
    if (update.new_routes) {
      const moe::RouteArray& piece = *update.new_routes;
      moe::RouteArray& kept =
          slot.stored_routes ? *slot.stored_routes : slot.stored_routes.emplace();
      if (kept.rows == 0) {
        kept.layers = piece.layers;
        kept.top_k = piece.top_k;
      }
      if (piece.first_row == kept.rows && piece.layers == kept.layers &&
          piece.top_k == kept.top_k) {
        kept.ids.insert(kept.ids.end(), piece.ids.begin(), piece.ids.end());
        kept.rows += piece.rows;
      } else {
        kept.rows = -1;
      }
    }
    if (update.routes) {
      slot.stored_routes = *update.routes;
      slot.stored_routes->weights.clear();
    }
  }
  // Encoding waits for stream_update / finish_job: here, on the strand, never the engine thread.
  if (update.new_routes && job->request.routes.stream)
    update.new_routes = select_routes(*update.new_routes, job->request.routes, server_.model);
  if (update.finished) {
    slot.finished = true;
    ++job->finished_count;
    result.finish_reason = update.finish_reason;
    const std::vector<int32_t>& stop_ids = job->request.sampling.stop_token_ids;
    if (!update.matched_stop.empty()) {
      result.finish_reason = engine::FinishReason::kStop;
      result.stop_reason = update.matched_stop;
    } else if (update.stop_token_id && (job->request.endpoint == Endpoint::kGenerate ||
                                        std::find(stop_ids.begin(), stop_ids.end(),
                                                  *update.stop_token_id) != stop_ids.end())) {
      result.stop_reason = *update.stop_token_id;
    }
    if (update.routes && job->request.routes.return_routes) {
      result.routes = select_routes(*update.routes, job->request.routes, server_.model);
    }
    if (update.finish_reason == engine::FinishReason::kError && !job->failure) {
      job->failure = api_error_from(update.error.is_ok()
                                        ? Status::error(ErrorCode::kInternal, "generation failed")
                                        : update.error);
      if (job->failure->http_status < 500) job->failure->http_status = 500;
    }
    double ttft = slot.first_token_at == Clock::time_point{}
                      ? -1
                      : seconds_between(job->arrival, slot.first_token_at);
    server_.metrics.record_choice(ttft, seconds_between(job->arrival, update.at),
                                  static_cast<int64_t>(result.token_ids.size()),
                                  finish_reason_name(result.finish_reason));
  }
  if (job->request.stream) stream_update(*job, slot, update.choice, update);
  if (job->finished_count == job->choices.size()) finish_job(job);
}

void Session::stream_update(Job& job, ChoiceSlot& slot, size_t index, const ChoiceUpdate& update) {
  ResponseContext context = response_context(job);
  const ApiRequest& request = job.request;
  if (update.finished && update.finish_reason == engine::FinishReason::kError)
    return;  // finish_job reports it
  // A chunk carries route fields when it has rows, and the final chunk always does.
  const bool has_rows = update.new_routes && update.new_routes->rows > 0;
  const moe::RouteArray* chunk_routes =
      update.new_routes && (has_rows || update.finished) ? &*update.new_routes : nullptr;
  if (!update.finished && update.text.empty() && update.token_ids.empty() && !has_rows) return;
  const ChoiceResult* final = update.finished ? &slot.result : nullptr;
  json chunk;
  if (request.endpoint == Endpoint::kGenerate) {
    // SGLang streams cumulative text and ids, and meta_info with every chunk.
    std::vector<ChoiceResult> one = {slot.result};
    if (chunk_routes) one[0].chunk_routes = *chunk_routes;
    ApiRequest single;  // only what generate_response reads; the replay array is not copied
    single.endpoint = Endpoint::kGenerate;
    single.return_logprob = request.return_logprob;
    single.sampling.prompt_logprobs = request.sampling.prompt_logprobs;
    single.routes = request.routes;
    single.prompts = {request.prompts[index / static_cast<size_t>(request.n)]};
    ResponseContext single_context{single,        server_.config, server_.model,
                                   context.codec, job.id,         job.created};
    chunk = generate_response(single_context, one, seconds_between(job.arrival, update.at));
    chunk["index"] = index;
    if (!update.finished) chunk["meta_info"]["finish_reason"] = nullptr;
  } else if (request.endpoint == Endpoint::kChat) {
    chunk = chat_chunk(context, static_cast<int>(index), !slot.sent_first, update.text,
                       update.token_ids, update.logprobs, final, chunk_routes);
    slot.sent_first = true;
  } else {
    std::string text = update.text;
    if (request.echo && !slot.sent_first)
      text = request.prompts[index / static_cast<size_t>(request.n)].text + text;
    chunk = completion_chunk(context, static_cast<int>(index), text, update.token_ids,
                             update.logprobs, slot.streamed_text_bytes, final, chunk_routes);
    slot.sent_first = true;
    slot.streamed_text_bytes += static_cast<int64_t>(text.size());
  }
  if (request.continuous_usage_stats && request.endpoint != Endpoint::kGenerate) {
    std::vector<ChoiceResult> results;
    for (const ChoiceSlot& s : job.choices) results.push_back(s.result);
    chunk["usage"] = usage_json(request, results);
  }
  enqueue(http_chunk(sse_event(chunk)));
}

void Session::store_routes(const Job& job, const std::vector<ChoiceResult>& results) {
  StoredRoutes stored;
  stored.id = job.id;
  stored.created = job.created;
  bool any = false;
  for (size_t i = 0; i < job.choices.size(); ++i) {
    StoredChoice choice;
    const std::optional<moe::RouteArray>& routes = job.choices[i].stored_routes;
    if (routes && routes->rows >= 0 &&
        routes->ids.size() == static_cast<size_t>(routes->rows * routes->layers * routes->top_k)) {
      choice.rows = routes->rows;
      choice.routed_experts = encode_routes_npy_base64(*routes, server_.model.num_experts);
      choice.token_ids = job.request.prompts[i / static_cast<size_t>(job.request.n)].ids;
      choice.token_ids.insert(choice.token_ids.end(), results[i].token_ids.begin(),
                              results[i].token_ids.end());
      any = true;
    }
    stored.choices.push_back(std::move(choice));
  }
  if (any) server_.route_store->put(std::move(stored));
}

void Session::finish_job(const std::shared_ptr<Job>& job) {
  job->done = true;
  ResponseContext context = response_context(*job);
  std::vector<ChoiceResult> results;
  results.reserve(job->choices.size());
  for (ChoiceSlot& slot : job->choices) results.push_back(std::move(slot.result));
  const ApiRequest& request = job->request;
  if (server_.route_store && !job->failure) store_routes(*job, results);
  if (request.stream) {
    if (job->failure) {
      enqueue(http_chunk(sse_event(error_body(*job->failure))));
    } else if (request.include_usage && request.endpoint != Endpoint::kGenerate) {
      enqueue(http_chunk(sse_event(usage_chunk(context, usage_json(request, results)))));
    }
    enqueue(http_chunk("data: [DONE]\n\n"));
    server_.metrics.record_http_status(200);
    response_done_ = true;
    enqueue(http_chunk(""));  // the zero-length chunk ends the body
  } else if (job->failure) {
    send_error(*job->failure);
  } else {
    json body =
        request.endpoint == Endpoint::kCompletions ? completion_response(context, results)
        : request.endpoint == Endpoint::kChat
            ? chat_response(context, results)
            : generate_response(context, results, seconds_between(job->arrival, Clock::now()));
    send_json(200, body);
  }
  job_.reset();
}

void Session::abort(const std::shared_ptr<Job>& job) {
  if (job != job_ || job->done || job->cancelled) return;
  engine::Engine* engine = server_.engine.load();
  for (size_t i = 0; i < job->choices.size(); ++i) {
    ChoiceSlot& slot = job->choices[i];
    if (slot.finished) continue;
    if (slot.submitted && engine) engine->cancel(slot.engine_id);
    ChoiceUpdate update;
    update.choice = i;
    update.finished = true;
    update.finish_reason = engine::FinishReason::kAbort;
    update.at = Clock::now();
    on_update(job, update);
    if (job_ != job) return;  // the last choice finished the job
  }
}

void Session::cancel_job() {
  if (!job_) return;
  std::shared_ptr<Job> job = std::move(job_);
  job_.reset();
  if (job->done || job->cancelled) return;
  job->cancelled = true;
  engine::Engine* engine = server_.engine.load();
  for (ChoiceSlot& slot : job->choices) {
    if (slot.submitted && !slot.finished && engine) engine->cancel(slot.engine_id);
  }
  server_.metrics.record_http_status(499);  // nginx's "client closed request"
}

// While a request is in flight, wait for the socket to become readable: EOF means the client is
// gone (cancel now); bytes mean a pipelined request (leave them for the next read).
void Session::watch_for_close() {
  if (watching_ || closed_ || !job_) return;
  watching_ = true;
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
        self->watching_ = false;
        if (!self->job_ || self->closed_) return;
        if (ec) {
          if (ec == net::error::operation_aborted && !self->closed_) return;
          self->cancel_job();
          return self->close();
        }
        char byte;
        beast::error_code peek_ec;
        size_t n = self->stream_.socket().receive(net::buffer(&byte, 1), tcp::socket::message_peek,
                                                  peek_ec);
        if (peek_ec == net::error::would_block || peek_ec == net::error::try_again)
          return self->watch_for_close();
        if (peek_ec || n == 0) {
          self->cancel_job();
          return self->close();
        }
        // Pipelined bytes: stop watching; the next read will take them.
      });
}

// ---------------------------------------------------------------------------------------------
// Writing.

void Session::send(int status, std::string_view content_type, std::string body,
                   std::string_view extra_headers) {
  server_.metrics.record_http_status(status);
  bool keep = keep_alive_ && !close_after_write_;
  std::string data = http_head(status, content_type, body.size(), keep, false, extra_headers);
  data += body;
  response_done_ = true;
  enqueue(std::move(data));
}

void Session::enqueue(std::string data) {
  if (closed_) return;
  outbox_.push_back(std::move(data));
  write_next();
}

void Session::write_next() {
  if (writing_ || outbox_.empty() || closed_) return;
  writing_ = true;
  stream_.expires_after(kWriteTimeout);
  net::async_write(stream_, net::buffer(outbox_.front()),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     self->writing_ = false;
                     if (ec) {
                       self->cancel_job();
                       return self->close();
                     }
                     self->outbox_.pop_front();
                     if (!self->outbox_.empty()) return self->write_next();
                     if (self->job_) {
                       self->stream_.expires_never();
                     } else if (self->response_done_) {
                       self->after_response();
                     }
                   });
}

void Session::after_response() {
  responding_ = false;
  response_done_ = false;
  if (close_after_write_ || !keep_alive_) return lingering_close();
  read_header();
}

// Close without losing the response: stop sending, then discard what the client still sends
// (closing a socket with unread data makes the kernel send RST, which can eat the response).
void Session::lingering_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.expires_after(std::chrono::seconds(2));
  discard_until_eof(std::make_shared<std::array<char, 65536>>());
}

void Session::discard_until_eof(std::shared_ptr<std::array<char, 65536>> scratch) {
  stream_.async_read_some(net::buffer(*scratch),
                          [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
                            if (ec) return self->close();
                            self->discard_until_eof(scratch);
                          });
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

// ---------------------------------------------------------------------------------------------
// Server.

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) std::make_shared<Session>(std::move(socket), *this)->run();
    accept();
  });
}

void Server::Impl::register_job(const std::shared_ptr<Job>& job) {
  std::lock_guard lock(jobs_mutex);
  jobs_by_id[job->id] = job;
  job->registered_names.push_back(job->id);
  if (!job->request.rid.empty() && job->request.rid != job->id) {
    jobs_by_id[job->request.rid] = job;
    job->registered_names.push_back(job->request.rid);
  }
}

void Server::Impl::unregister_job(const Job& job) {
  std::lock_guard lock(jobs_mutex);
  for (const std::string& name : job.registered_names) {
    auto it = jobs_by_id.find(name);
    if (it != jobs_by_id.end() && it->second.expired()) jobs_by_id.erase(it);
  }
}

void Server::Impl::abort_job(const std::shared_ptr<Job>& job) {
  job->post_to_session([job] {
    if (auto session = job->session.lock()) session->abort(job);
  });
}

void Server::Impl::abort_all() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(jobs_mutex);
    for (auto& [name, weak] : jobs_by_id) {
      if (auto job = weak.lock()) jobs.push_back(job);
    }
  }
  for (auto& job : jobs) abort_job(job);
}

void Server::Impl::stop_now() {
  {
    std::lock_guard lock(state_mutex);
    if (stopped) return;
    stopped = true;
    drained = true;
  }
  state_cv.notify_all();
  net::post(ioc, [this] {
    beast::error_code ec;
    acceptor.close(ec);
    signals.cancel(ec);
  });
  abort_all();
  work.reset();
  // Give aborted requests a moment to send their answers, then stop the loop.
  auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(200));
  timer->async_wait([this, timer](beast::error_code) { ioc.stop(); });
  for (std::thread& t : threads) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
  threads.clear();
  blocking.join();
  // Sessions still owned by the io_context are destroyed with it, possibly after the engine:
  // they must not reach it any more.
  engine.store(nullptr);
}

// Every 20 ms: done when no request is left or the deadline passed (then what is left is aborted).
void Server::Impl::poll_drain(std::shared_ptr<net::steady_timer> timer,
                              Clock::time_point deadline) {
  if (jobs_alive.load() == 0 || Clock::now() >= deadline) {
    if (jobs_alive.load() != 0) abort_all();
    // Let the last answers reach their sockets before reporting the drain complete.
    timer->expires_after(std::chrono::milliseconds(100));
    timer->async_wait([this, timer](beast::error_code) { finish_drain(); });
    return;
  }
  timer->expires_after(std::chrono::milliseconds(20));
  timer->async_wait([this, timer, deadline](beast::error_code ec) {
    if (!ec) poll_drain(timer, deadline);
  });
}

void Server::Impl::finish_drain() {
  {
    std::lock_guard lock(state_mutex);
    drained = true;
  }
  state_cv.notify_all();
}

Server::Server(ServerConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Server::~Server() {
  stop();
}

Status Server::start() {
  Impl& s = *impl_;
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(s.config.host, ec);
  if (ec) return Status::errorf("--host {} is not an IP address: {}", s.config.host, ec.message());
  tcp::endpoint endpoint{address, s.config.port};
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::errorf("cannot listen on {}:{}: {}", s.config.host, s.config.port, ec.message());
  }
  if (s.config.handle_signals) {
    s.signals.add(SIGTERM);
    s.signals.add(SIGINT);
    s.signals.async_wait([this](beast::error_code error, int) {
      if (!error) request_shutdown();
    });
  }
  s.work.emplace(s.ioc.get_executor());
  s.accept();
  int threads = std::max(1, s.config.io_threads);
  for (int i = 0; i < threads; ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
  return Status::ok();
}

uint16_t Server::port() const {
  beast::error_code ec;
  auto endpoint = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

void Server::attach(engine::Engine& engine, const TextCodec& codec) {
  impl_->model = engine.model_info();
  impl_->codec.store(&codec);
  impl_->engine.store(&engine);
}

void Server::request_shutdown() {
  Impl& s = *impl_;
  if (s.draining.exchange(true)) return;
  auto deadline = Clock::now() + std::chrono::milliseconds(
                                     static_cast<int64_t>(s.config.shutdown_timeout_s * 1000));
  auto timer = std::make_shared<net::steady_timer>(s.ioc);
  net::post(s.ioc, [&s, timer, deadline] { s.poll_drain(timer, deadline); });
}

void Server::wait() {
  {
    std::unique_lock lock(impl_->state_mutex);
    impl_->state_cv.wait(lock, [this] { return impl_->drained; });
  }
  stop();
}

void Server::stop() {
  impl_->stop_now();
}

}  // namespace sy::server
