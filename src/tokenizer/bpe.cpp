#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>
#include <queue>

#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace sy::tokenizer {

Result<std::shared_ptr<Bpe>> Bpe::from_json(const nlohmann::json& model) {
  auto bpe = std::make_shared<Bpe>();
  const auto optional_string = [&](const char* key) -> std::string {
    return model.contains(key) && model[key].is_string() ? model[key].get<std::string>() : std::string();
  };
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
    return Status::error(ErrorCode::kUnsupported, "unsupported BPE feature: dropout (random merges)");
  }
  if (!optional_string("continuing_subword_prefix").empty()) {
    return Status::error(ErrorCode::kUnsupported, "unsupported BPE feature: continuing_subword_prefix");
  }
  if (!optional_string("end_of_word_suffix").empty()) {
    return Status::error(ErrorCode::kUnsupported, "unsupported BPE feature: end_of_word_suffix");
  }
  SY_ASSIGN(bpe->ignore_merges_, optional_bool(model, "ignore_merges", false, "model"));
  SY_ASSIGN(bpe->byte_fallback_, optional_bool(model, "byte_fallback", false, "model"));
  SY_ASSIGN(bpe->fuse_unk_, optional_bool(model, "fuse_unk", false, "model"));

  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Status::error("BPE model needs an object \"vocab\"");
  }
  int64_t max_id = -1;
  for (const auto& [token, id_json] : model["vocab"].items()) {
    SY_ASSIGN(const int32_t id, token_id(id_json, fmt::format("vocab entry {:?}", token)));
    bpe->vocab_[token] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  bpe->tokens_by_id_.resize(static_cast<size_t>(max_id + 1));
  bpe->has_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->tokens_by_id_[id] = token;
    bpe->has_token_[id] = true;
  }

  if (!model.contains("merges") || !model["merges"].is_array()) {
    return Status::error("BPE model needs an array \"merges\"");
  }
  const auto& merges = model["merges"];
  bpe->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {  // legacy "left right"
      const std::string line = merge;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Status::errorf("merge {} ({:?}) must be two tokens separated by one space", rank, line);
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0];
      right = merge[1];
    } else {
      return Status::errorf("merge {} must be \"a b\" or [\"a\", \"b\"]", rank);
    }
    const auto left_id = bpe->token_to_id(left), right_id = bpe->token_to_id(right),
               new_id = bpe->token_to_id(left + right);
    if (!left_id || !right_id || !new_id) {
      return Status::errorf("merge {} ({:?} + {:?}) uses or makes a token missing from the vocab", rank, left, right);
    }
    // Like HF, a pair listed twice keeps its last rank.
    bpe->merges_[pair_key(*left_id, *right_id)] = Merge{static_cast<int32_t>(rank), *new_id};
  }

  const std::string unk = optional_string("unk_token");
  if (!unk.empty()) {
    bpe->unk_id_ = bpe->token_to_id(unk);
    if (!bpe->unk_id_) return Status::errorf("BPE unk_token {:?} is not in the vocab", unk);
  }
  if (bpe->byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      const auto id = bpe->token_to_id(fmt::format("<0x{:02X}>", b));
      bpe->byte_fallback_ids_[b] = id ? *id : -1;
    }
  }
  return bpe;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_by_id_.size() || !has_token_[id]) return nullptr;
  return &tokens_by_id_[id];
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, ids);
    return;
  }
  CacheShard& shard = cache_[StringHash()(word) % kCacheShards];
  {
    std::lock_guard lock(shard.mutex);
    const auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  merge_word(word, word_ids);
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  std::lock_guard lock(shard.mutex);
  if (shard.words.size() >= kCacheEntriesPerShard) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(word_ids));
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  // Symbols form a linked list; a merged-away symbol gets length 0 (HF's Word).
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    int32_t length;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, size_t length) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, static_cast<int32_t>(length)});
  };
  // An unknown character waits, so that fuse_unk can extend it, until a known one follows.
  bool unk_pending = false;
  size_t unk_length = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    utf8::next(word, pos);
    const std::string_view character = word.substr(begin, pos - begin);
    if (const auto id = token_to_id(character)) {
      if (unk_pending) add(*unk_id_, unk_length);
      unk_pending = false;
      add(*id, character.size());
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char c : character) all_bytes &= byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {  // like HF, a waiting unknown is not emitted first
        for (const char c : character) add(byte_fallback_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending && fuse_unk_) {
        unk_length += character.size();
      } else {
        if (unk_pending) add(*unk_id_, unk_length);
        unk_pending = true;
        unk_length = character.size();
      }
    }
  }
  if (unk_pending) add(*unk_id_, unk_length);

  struct Candidate {
    int32_t pos, rank, new_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto find_merge = [&](int32_t left, int32_t right) -> const Merge* {
    const auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* merge = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({static_cast<int32_t>(i), merge->rank, merge->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.length == 0 || current.next == -1) continue;
    const int32_t right_index = current.next;
    const Symbol right = symbols[right_index];
    // Stale entry: the pair at this position no longer makes this token.
    const Merge* merge = find_merge(current.id, right.id);
    if (!merge || merge->new_id != top.new_id) continue;
    current.id = top.new_id;
    current.length += right.length;
    current.next = right.next;
    symbols[right_index].length = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (current.prev >= 0) {
      if (const Merge* left_merge = find_merge(symbols[current.prev].id, current.id)) {
        queue.push({current.prev, left_merge->rank, left_merge->new_id});
      }
    }
    if (current.next >= 0) {
      if (const Merge* right_merge = find_merge(current.id, symbols[current.next].id)) {
        queue.push({top.pos, right_merge->rank, right_merge->new_id});
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.length != 0) ids.push_back(symbol.id);
  }
}

}  // namespace sy::tokenizer
