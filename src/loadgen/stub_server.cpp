#include "loadgen/stub_server.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/dtype.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

struct StubServer::Impl {
  Impl(StubServer& owner, const StubServerOptions& options)
      : owner(owner), options(options), acceptor(io) {}

  StubServer& owner;
  StubServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::atomic<long> routed_responses{0};

  asio::awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(
          asio::make_strand(io), asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) continue;  // e.g. EMFILE: keep serving the connections we have
      auto executor = socket.get_executor();
      asio::co_spawn(executor, session(std::move(socket)), asio::detached);
    }
  }

  asio::awaitable<void> session(tcp::socket socket) {
    const int open = ++owner.open_;
    int peak = owner.peak_open_.load();
    while (open > peak && !owner.peak_open_.compare_exchange_weak(peak, open)) {
    }
    boost::system::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    try {
      for (;;) {
        http::request<http::string_body> request;
        co_await http::async_read(stream, buffer, request,
                                  asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        // Counted before the answer is written, so a client that has read the answer sees the count
        // (counting afterwards raced with the client finishing its run).
        ++owner.requests_served_;
        const bool keep_alive = co_await respond(stream, request);
        if (!keep_alive) break;
      }
    } catch (const std::exception&) {
      // a write to a peer that went away: just drop the connection
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    --owner.open_;
  }

  static int count_prompt_tokens(const json& prompt) {
    if (prompt.is_array()) return static_cast<int>(prompt.size());
    if (!prompt.is_string()) return 0;
    std::istringstream words(prompt.get<std::string>());
    int count = 0;
    for (std::string word; words >> word;) ++count;
    return std::max(count, 1);  // the stub's crude count: whitespace-separated words
  }

  // Base64 of the routes for N = prompt + completion tokens: a .npy (N-1, L, K) or flat int32.
  std::string make_routes(int prompt_tokens, int completion_tokens, bool flat_int32) {
    int64_t rows = std::max(0, prompt_tokens + completion_tokens - 1);
    const long serial = ++routed_responses;
    if (options.corrupt_routes_every > 0 && serial % options.corrupt_routes_every == 0 &&
        rows > 0) {
      --rows;  // deliberately wrong, so the client's check can be seen to fail
    }
    const int64_t layers = options.route_layers, top_k = options.route_top_k;
    std::vector<int32_t> ids(static_cast<size_t>(rows * layers * top_k));
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (int64_t k = 0; k < top_k; ++k) {
          ids[static_cast<size_t>((row * layers + layer) * top_k + k)] =
              static_cast<int32_t>((row * 7 + layer * 3 + k) % options.route_num_experts);
        }
      }
    }
    if (flat_int32) {
      return base64_encode(
          std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
    }
    const std::vector<int64_t> shape{rows, layers, top_k};
    if (options.route_num_experts <= 256) {
      std::vector<uint8_t> narrow(ids.begin(), ids.end());
      return base64_encode(npy_encode(DType::kU8, shape, narrow.data()));
    }
    std::vector<uint16_t> narrow(ids.begin(), ids.end());
    return base64_encode(npy_encode(DType::kU16, shape, narrow.data()));
  }

  template <class Body>
  asio::awaitable<bool> send_simple(beast::tcp_stream& stream, const http::request<Body>& request,
                                    http::status status, std::string body) {
    http::response<http::string_body> response{status, 11};
    response.set(http::field::content_type, "application/json");
    response.keep_alive(request.keep_alive());
    response.body() = std::move(body);
    response.prepare_payload();
    co_await http::async_write(stream, response, asio::use_awaitable);
    co_return request.keep_alive();
  }

  asio::awaitable<bool> respond(beast::tcp_stream& stream,
                                const http::request<http::string_body>& request) {
    const std::string target(request.target());
    if (request.method() == http::verb::get && target == "/v1/models") {
      co_return co_await send_simple(
          stream, request, http::status::ok,
          R"({"object":"list","data":[{"id":"stub","object":"model","root":"stub","owned_by":"switchyard"}]})");
    }
    if (request.method() == http::verb::get && target == "/health") {
      co_return co_await send_simple(stream, request, http::status::ok, "{}");
    }
    const bool completions = target == "/v1/completions";
    const bool chat = target == "/v1/chat/completions";
    const bool generate = target == "/generate";
    if (request.method() != http::verb::post || !(completions || chat || generate)) {
      co_return co_await send_simple(
          stream, request, http::status::not_found,
          R"({"error":{"message":"not found","type":"NotFoundError","code":404}})");
    }
    json body = json::parse(request.body(), nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      co_return co_await send_simple(
          stream, request, http::status::bad_request,
          R"({"error":{"message":"body is not a JSON object","type":"BadRequestError","code":400}})");
    }

    int tokens = options.default_tokens;
    int prompt_tokens = 0;
    if (generate) {
      const json sampling = body.value("sampling_params", json::object());
      tokens = sampling.value("max_new_tokens", tokens);
      prompt_tokens = count_prompt_tokens(body.contains("input_ids") ? body["input_ids"]
                                                                     : body.value("text", json()));
    } else if (chat) {
      tokens = body.value("max_completion_tokens", body.value("max_tokens", tokens));
      for (const json& message : body.value("messages", json::array())) {
        prompt_tokens += count_prompt_tokens(message.value("content", json()));
      }
    } else {
      tokens = body.value("max_tokens", tokens);
      prompt_tokens = count_prompt_tokens(body.value("prompt", json()));
    }
    tokens = std::max(tokens, 1);
    const bool stream_response = body.value("stream", false);
    const bool routed = options.send_routes && body.value("return_routed_experts", false);
    const std::string model = body.value("model", std::string("stub"));

    if (!stream_response) {  // whole answer at once
      json answer;
      std::string text;
      for (int i = 0; i < tokens; ++i) text += " tok";
      if (generate) {
        answer = {{"text", text},
                  {"meta_info", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", tokens}}}};
        if (routed)
          answer["meta_info"]["routed_experts"] = make_routes(prompt_tokens, tokens, true);
      } else {
        json choice = {{"index", 0}, {"finish_reason", "length"}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", text}};
        } else {
          choice["text"] = text;
        }
        if (routed) choice["routed_experts"] = make_routes(prompt_tokens, tokens, false);
        answer = {{"id", "stub-1"},
                  {"object", chat ? "chat.completion" : "text_completion"},
                  {"model", model},
                  {"choices", json::array({choice})},
                  {"usage",
                   {{"prompt_tokens", prompt_tokens},
                    {"completion_tokens", tokens},
                    {"total_tokens", prompt_tokens + tokens}}}};
      }
      co_return co_await send_simple(stream, request, http::status::ok, answer.dump());
    }

    http::response<http::empty_body> response{http::status::ok, 11};
    response.set(http::field::content_type, "text/event-stream");
    response.set(http::field::cache_control, "no-cache");
    response.keep_alive(request.keep_alive());
    response.chunked(true);
    http::response_serializer<http::empty_body> serializer{response};
    co_await http::async_write_header(stream, serializer, asio::use_awaitable);

    asio::steady_timer pacing(stream.get_executor());
    // Middle tokens of completions and chat are the same bytes every time: build them once, so
    // the stub spends its time writing, not formatting JSON.
    auto completion_chunk = [&](bool first, bool last) {
      json choice = {
          {"index", 0}, {"logprobs", nullptr}, {"finish_reason", last ? json("length") : json()}};
      if (chat) {
        choice["delta"] =
            first ? json{{"role", "assistant"}, {"content", " tok"}} : json{{"content", " tok"}};
      } else {
        choice["text"] = " tok";
      }
      if (last && routed) choice["routed_experts"] = make_routes(prompt_tokens, tokens, false);
      return "data: " +
             json{{"id", "stub-1"},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", 0},
                  {"model", model},
                  {"choices", json::array({choice})}}
                 .dump() +
             "\n\n";
    };
    const std::string middle_chunk = generate ? std::string() : completion_chunk(false, false);
    std::string event, cumulative_text;
    for (int i = 0; i < tokens; ++i) {
      const bool last = i + 1 == tokens;
      if (generate) {
        cumulative_text += " tok";
        json meta = {
            {"id", "stub"},
            {"prompt_tokens", prompt_tokens},
            {"completion_tokens", i + 1},
            {"finish_reason", last ? json{{"type", "length"}, {"length", tokens}} : json()}};
        if (last && routed) meta["routed_experts"] = make_routes(prompt_tokens, tokens, true);
        event = "data: " + json{{"text", cumulative_text}, {"meta_info", meta}}.dump() + "\n\n";
      } else if (i == 0 || last) {
        event = completion_chunk(i == 0, last);
      } else {
        event = middle_chunk;
      }
      co_await write_event(stream, event, i);
      if (options.token_interval_s > 0 && !last) {
        pacing.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(options.token_interval_s)));
        co_await pacing.async_wait(asio::use_awaitable);
      }
    }
    if (!generate) {
      event = "data: " +
              json{{"id", "stub-1"},
                   {"object", chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", 0},
                   {"model", model},
                   {"choices", json::array()},
                   {"usage",
                    {{"prompt_tokens", prompt_tokens},
                     {"completion_tokens", tokens},
                     {"total_tokens", prompt_tokens + tokens}}}}
                  .dump() +
              "\n\n";
      co_await write_event(stream, event, tokens);
    }
    co_await write_event(stream, "data: [DONE]\n\n", tokens + 1);
    co_await asio::async_write(stream, http::make_chunk_last(), asio::use_awaitable);
    co_return request.keep_alive();
  }

  asio::awaitable<void> write_event(beast::tcp_stream& stream, const std::string& event,
                                    int serial) {
    if (!options.split_events || event.size() < 2) {
      co_await asio::async_write(stream, http::make_chunk(asio::buffer(event)),
                                 asio::use_awaitable);
      co_return;
    }
    // Cut somewhere different each time, including inside "data:" and inside the "\n\n".
    const size_t cut = 1 + static_cast<size_t>(serial * 7919) % (event.size() - 1);
    co_await asio::async_write(stream, http::make_chunk(asio::buffer(event.data(), cut)),
                               asio::use_awaitable);
    co_await asio::async_write(
        stream, http::make_chunk(asio::buffer(event.data() + cut, event.size() - cut)),
        asio::use_awaitable);
  }
};

Result<std::unique_ptr<StubServer>> StubServer::start(const StubServerOptions& options) {
  if (options.threads < 1) return Status::errorf("threads must be >= 1, got {}", options.threads);
  if (options.route_layers < 1 || options.route_top_k < 1 ||
      options.route_top_k > options.route_num_experts || options.route_num_experts > 65536) {
    return Status::error("routes need layers >= 1 and 1 <= top_k <= num_experts <= 65536");
  }
  std::unique_ptr<StubServer> server(new StubServer());
  server->impl_ = std::make_unique<Impl>(*server, options);
  Impl& impl = *server->impl_;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) return Status::errorf("--host '{}' is not an IP address", options.host);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(4096, ec);  // thousands of clients may connect at once
  if (ec)
    return Status::errorf("cannot listen on {}:{}: {}", options.host, options.port, ec.message());
  server->port_ = impl.acceptor.local_endpoint().port();
  asio::co_spawn(impl.io, impl.accept_loop(), asio::detached);
  for (int i = 0; i < options.threads; ++i) {
    server->threads_.emplace_back([&impl] { impl.io.run(); });
  }
  return server;
}

void StubServer::stop() {
  if (!impl_) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
  });
  impl_->io.stop();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  impl_.reset();
}

StubServer::~StubServer() {
  stop();
}

}  // namespace sy::loadgen
