// tokenizer.json "model" of type BPE: vocabulary, ranked merges (both the "a b" string and the
// ["a", "b"] pair encodings), ignore_merges, byte_fallback, unk_token; HF's merge order exactly
// (lowest rank first, then leftmost), with a thread-safe per-word cache.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace sy::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  static Result<std::shared_ptr<Bpe>> from_json(const nlohmann::json& model);
  // Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // null when the id has no token
  int64_t max_id() const { return static_cast<int64_t>(tokens_by_id_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  TokenMap vocab_;
  std::vector<std::string> tokens_by_id_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_fallback_ids_{};

  // Word cache: sharded so concurrent encodes rarely contend; a full shard is simply cleared.
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kCacheEntriesPerShard = 4096;
  static constexpr size_t kCacheMaxWordBytes = 256;
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  std::unique_ptr<CacheShard[]> cache_ = std::make_unique<CacheShard[]>(kCacheShards);
};

}  // namespace sy::tokenizer
