// Test-only stand-ins for the engine and the tokenizer, so the HTTP layer can be tested on its own:
// deterministic tokens, fabricated routes of the real shape, a step thread that calls back like the
// real engine does. Never a substitute for the end-to-end tests against `switchyard serve`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "server/server.h"

namespace sy::testing {

// Byte-level codec: ids 0..255 are bytes, 256 "<eos>", 257 "<bos>", the rest "<tokN>" (special).
class FakeCodec : public server::TextCodec {
 public:
  static constexpr int32_t kEos = 256;
  static constexpr int32_t kBos = 257;
  static constexpr int64_t kVocab = 300;

  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    if (add_special) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 256) {
        out += static_cast<char>(id);
      } else if (!skip_special) {
        out += token_text(id);
      }
    }
    return out;
  }
  std::string token_text(int32_t id) const override {
    if (id < 256) return std::string(1, static_cast<char>(id));
    if (id == kEos) return "<eos>";
    if (id == kBos) return "<bos>";
    return "<tok" + std::to_string(id) + ">";
  }
  class Stream : public server::TokenStream {
   public:
    Stream(const FakeCodec& codec, bool skip) : codec_(codec), skip_(skip) {}
    std::string push(int32_t id) override {
      pending_ += codec_.decode({id}, skip_);
      // Emit the longest prefix that ends on a complete UTF-8 character.
      size_t end = pending_.size();
      size_t back = 0;
      while (back < 4 && back < end &&
             (static_cast<unsigned char>(pending_[end - 1 - back]) & 0xC0) == 0x80)
        ++back;
      if (back < end) {
        unsigned char lead = static_cast<unsigned char>(pending_[end - 1 - back]);
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (need > back + 1) end -= back + 1;
      }
      std::string out = pending_.substr(0, end);
      pending_.erase(0, end);
      return out;
    }
    std::string flush() override { return std::exchange(pending_, std::string()); }

   private:
    const FakeCodec& codec_;
    bool skip_;
    std::string pending_;
  };
  std::unique_ptr<server::TokenStream> stream(bool skip_special) const override {
    return std::make_unique<Stream>(*this, skip_special);
  }
  Result<std::string> render_chat(const nlohmann::ordered_json& messages,
                                  const nlohmann::ordered_json&, bool add_generation_prompt,
                                  const nlohmann::ordered_json&) const override {
    std::string out;
    for (const auto& m : messages) {
      std::string role = m.value("role", "");
      if (role == "invalid") return Status::error("role 'invalid' is not allowed by this template");
      std::string content = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
      if (role == "redacted") content = "[redacted]";  // a template that drops the content
      if (role == "trimmed") content.erase(content.find_last_not_of(' ') + 1);  // one that trims it
      out += "<|" + role + "|>" + content + "\n";
    }
    if (add_generation_prompt) out += "<|assistant|>";
    return out;
  }
};

struct FakeEngineOptions {
  int step_delay_ms = 1;
  bool route_weights = true;  // false: like a kernel that cannot write gating weights
  int max_waiting_requests = 1000;
  int64_t max_model_len = 512;
};

// Generated token j (0-based) of a request: letters a..z from the prompt, position and seed.
inline int32_t fake_token(const std::vector<int32_t>& prompt, int j, std::optional<uint64_t> seed,
                          float temperature) {
  uint64_t h = 0;
  for (int32_t id : prompt) h = h * 31 + static_cast<uint64_t>(id);
  if (temperature > 0 && seed) h ^= *seed * 0x9E3779B97F4A7C15ull;
  h += static_cast<uint64_t>(j) * 7;
  return static_cast<int32_t>('a' + (h % 26));
}

// Gating weight of slot k of a route row (a float16-exact value, so the wire can be checked).
inline float fake_weight(int64_t position, int layer, int k) {
  return static_cast<float>(1 + (position * 3 + layer + k) % 64) / 128.0f;
}

// Route of input position `position` holding token `token`: two distinct experts per MoE layer.
inline void fake_route(int32_t token, int64_t position, int layer, int32_t* out) {
  out[0] = (token + layer) % 16;
  out[1] = (out[0] + 1 + static_cast<int32_t>(position % 15)) % 16;
}

class FakeEngine : public engine::Engine {
 public:
  // A prompt containing this token fails with a route-capture error (the 500 path).
  static constexpr int32_t kPoisonToken = 299;

  explicit FakeEngine(FakeEngineOptions options = {}) : options_(options) {
    info_.architecture = "fake_moe";
    info_.vocab_size = FakeCodec::kVocab;
    info_.max_model_len = options.max_model_len;
    info_.num_hidden_layers = 4;
    info_.moe_layers = {1, 2, 3};
    info_.num_experts = 16;
    info_.top_k = 2;
    info_.eos_token_ids = {FakeCodec::kEos};
    info_.route_weights = options.route_weights;
    if (!options.route_weights)
      info_.route_weights_unavailable = "MoE kernel fake-fused does not write gating weights";
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override { shutdown(0); }

  Result<engine::RequestId> submit(engine::GenerationRequest request,
                                   engine::EventCallback on_event) override {
    for (int32_t id : request.prompt_ids) {
      if (id < 0 || id >= info_.vocab_size) return Status::errorf("token id {} out of range", id);
    }
    if (request.prompt_ids.empty()) return Status::error("empty prompt");
    if (static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_tokens >
        info_.max_model_len) {
      return Status::error("prompt + max_tokens exceeds the context");
    }
    if (request.replay) {
      const auto& r = *request.replay;
      if (r.layers != info_.num_hidden_layers || r.top_k != info_.top_k ||
          r.rows > static_cast<int64_t>(request.prompt_ids.size())) {
        return Status::error("bad replay shape");
      }
    }
    std::lock_guard lock(mutex_);
    if (static_cast<int>(active_.size()) >= options_.max_waiting_requests) {
      return Status::error(ErrorCode::kResourceExhausted, "queue full");
    }
    engine::RequestId id = ++next_id_;
    Active a;
    a.request = std::move(request);
    a.callback = std::move(on_event);
    active_.emplace(id, std::move(a));
    ++submitted_total_;
    cv_.notify_all();
    return id;
  }
  void cancel(engine::RequestId id) override {
    std::lock_guard lock(mutex_);
    if (active_.erase(id)) ++cancelled_total_;
  }
  engine::EngineMetrics metrics() const override {
    std::lock_guard lock(mutex_);
    engine::EngineMetrics m;
    m.running_requests = static_cast<int64_t>(active_.size());
    m.kv_blocks_total = 1024;
    for (const auto& [id, a] : active_) {
      m.kv_blocks_used +=
          static_cast<int64_t>(a.request.prompt_ids.size() + a.generated.size() + 15) / 16;
    }
    m.kv_blocks_free = m.kv_blocks_total - m.kv_blocks_used;
    m.generation_tokens_total = generated_total_;
    return m;
  }
  engine::ModelInfo model_info() const override { return info_; }
  Status update_weights_from_disk(const std::string& model_dir) override {
    if (model_dir == "/nonexistent")
      return Status::error(ErrorCode::kNotFound, "no such directory: " + model_dir);
    std::lock_guard lock(mutex_);
    ++weight_version_;
    return Status::ok();
  }
  Status flush_cache() override { return Status::ok(); }
  void shutdown(int64_t) override {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  int64_t active_count() const {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(active_.size());
  }
  int64_t cancelled_total() const {
    std::lock_guard lock(mutex_);
    return cancelled_total_;
  }
  int64_t submitted_total() const {
    std::lock_guard lock(mutex_);
    return submitted_total_;
  }
  void set_step_delay_ms(int ms) { step_delay_ms_ = ms; }

 private:
  struct Active {
    engine::GenerationRequest request;
    engine::EventCallback callback;
    std::vector<int32_t> generated;
    bool sent_first = false;
    int64_t routes_streamed = 0;
  };

  // The route fields of an event: the whole log at the end, or each event's new rows.
  void add_routes(Active& a, engine::Event& event) const {
    if (a.request.stream_routes) {
      moe::RouteArray all = routes_of(a);
      moe::RouteArray piece = all;
      piece.first_row = a.routes_streamed;
      piece.rows = all.rows - a.routes_streamed;
      const size_t row_ints = static_cast<size_t>(all.layers * all.top_k);
      piece.ids.assign(all.ids.begin() + static_cast<long>(a.routes_streamed * row_ints),
                       all.ids.end());
      if (!all.weights.empty())
        piece.weights.assign(all.weights.begin() + static_cast<long>(a.routes_streamed * row_ints),
                             all.weights.end());
      a.routes_streamed = all.rows;
      event.new_routes = std::make_shared<const moe::RouteArray>(std::move(piece));
    } else if (event.finished && a.request.return_routes) {
      event.routes = std::make_shared<const moe::RouteArray>(routes_of(a));
    }
  }

  // Routes for rows 0 .. N-2 of prompt + generated, with replayed rows copied as given.
  moe::RouteArray routes_of(const Active& a) const {
    std::vector<int32_t> all = a.request.prompt_ids;
    all.insert(all.end(), a.generated.begin(), a.generated.end());
    moe::RouteArray r;
    r.rows = static_cast<int64_t>(all.size()) - 1;
    r.layers = info_.num_hidden_layers;
    r.top_k = info_.top_k;
    r.ids.assign(static_cast<size_t>(r.rows * r.layers * r.top_k), 0);
    if (a.request.return_route_weights) r.weights.assign(r.ids.size(), 0.0f);
    for (int64_t row = 0; row < r.rows; ++row) {
      for (int layer : info_.moe_layers) {
        int32_t* out = r.row_ptr(row) + layer * r.top_k;
        if (a.request.return_route_weights)
          for (int k = 0; k < r.top_k; ++k)
            r.weights[static_cast<size_t>((row * r.layers + layer) * r.top_k + k)] =
                fake_weight(row, layer, k);
        if (a.request.replay && row < a.request.replay->rows) {
          for (int k = 0; k < r.top_k; ++k) out[k] = a.request.replay->at(row, layer, k);
        } else {
          fake_route(all[static_cast<size_t>(row)], row, layer, out);
        }
      }
    }
    return r;
  }

  engine::TokenLogprob logprob_of(int32_t token, int k) const {
    engine::TokenLogprob lp{
        token, -0.01f * static_cast<float>(token % 50) - 0.001f * weight_version_, {}};
    for (int i = 0; i < k; ++i)
      lp.top.push_back({(token + i) % 256, -0.1f * static_cast<float>(i)});
    return lp;
  }

  void loop() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (active_.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !active_.empty(); });
        continue;
      }
      std::vector<engine::RequestId> ids;
      for (auto& [id, a] : active_) ids.push_back(id);
      for (engine::RequestId id : ids) {
        auto it = active_.find(id);
        if (it == active_.end()) continue;
        Active& a = it->second;
        engine::Event event;
        event.request_id = id;
        const auto& s = a.request.sampling;
        if (!a.sent_first) {
          a.sent_first = true;
          if (s.prompt_logprobs >= 0) {
            for (size_t p = 1; p < a.request.prompt_ids.size(); ++p) {
              engine::TokenLogprob lp = logprob_of(a.request.prompt_ids[p], s.prompt_logprobs);
              if (a.request.replay && static_cast<int64_t>(p - 1) < a.request.replay->rows) {
                lp.logprob -= 0.0001f * static_cast<float>(a.request.replay->at(
                                            static_cast<int64_t>(p - 1), 1, 0));
              }
              event.prompt_logprobs.push_back(lp);
            }
          }
          bool poisoned = false;
          for (int32_t t : a.request.prompt_ids) poisoned |= t == kPoisonToken;
          if (poisoned) {
            event.finished = true;
            event.finish_reason = engine::FinishReason::kError;
            event.error = Status::error(
                ErrorCode::kInternal,
                "route for layer 2 was not written by kernel 'fake' (poison left in the buffer)");
            auto callback = std::move(a.callback);
            active_.erase(it);
            lock.unlock();
            callback(event);
            lock.lock();
            continue;
          }
        }
        int j = static_cast<int>(a.generated.size());
        int32_t token = fake_token(a.request.prompt_ids, j, s.seed, s.temperature);
        a.generated.push_back(token);
        ++generated_total_;
        event.new_token_ids = {token};
        if (s.logprobs >= 0) event.new_logprobs = {logprob_of(token, s.logprobs)};
        bool stop_token = std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) !=
                          s.stop_token_ids.end();
        if (stop_token && j + 1 >= s.min_tokens) {
          event.finished = true;
          event.finish_reason = engine::FinishReason::kStop;
          event.stop_token_id = token;
        } else if (j + 1 >= s.max_tokens) {
          event.finished = true;
          event.finish_reason = engine::FinishReason::kLength;
        }
        add_routes(a, event);
        engine::EventCallback callback = a.callback;  // copy: cancel may erase `a` meanwhile
        bool finished = event.finished;
        if (finished) active_.erase(it);
        lock.unlock();
        engine::Continuation next = callback(event);
        lock.lock();
        if (!finished && next == engine::Continuation::kStop) {
          auto again = active_.find(id);
          if (again == active_.end()) continue;
          engine::Event final_event;
          final_event.request_id = id;
          final_event.finished = true;
          final_event.finish_reason = engine::FinishReason::kStop;
          add_routes(again->second, final_event);
          active_.erase(again);
          lock.unlock();
          callback(final_event);
          lock.lock();
        }
      }
      int delay = step_delay_ms_.load();
      if (delay > 0) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        lock.lock();
      }
    }
  }

  FakeEngineOptions options_;
  engine::ModelInfo info_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<engine::RequestId, Active> active_;
  engine::RequestId next_id_ = 0;
  int64_t generated_total_ = 0;
  int64_t submitted_total_ = 0;
  int64_t cancelled_total_ = 0;
  int weight_version_ = 0;
  bool stopping_ = false;
  std::atomic<int> step_delay_ms_{options_.step_delay_ms};
  std::thread thread_;
};

}  // namespace sy::testing
