#include "tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace sy::tokenizer {

using nlohmann::json;

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::shared_ptr<Bpe> model;
  std::vector<AddedToken> added;  // never resized after load: the matchers point into it
  // What decode and id_to_token show for an added token: for `normalized` ones the normalizer's
  // output of the content (HF's normalized cache, tokenizers >= 0.22), else the content.
  std::vector<std::string> added_spelling;
  std::unordered_map<int32_t, size_t> added_by_id;
  TokenMap added_by_content;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  std::vector<int32_t> prefix_ids, suffix_ids;  // what the post-processor wraps around the ids
  bool byte_level_decoder = false;
  int64_t vocab_size = 0;
  std::vector<std::string> token_bytes;  // per id: its contribution to decoded text
  std::vector<uint8_t> special;          // per id
  json config;

  void encode_valid(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids) const;
  const std::string* token_for_id(int32_t id) const;
};

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(ErrorCode::kNotFound, fmt::format("{}: cannot open", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

Result<json> parse_json(std::string_view text, const char* what) {
  json parsed = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Status::errorf("{} is not valid JSON", what);
  if (!parsed.is_object()) return Status::errorf("{} must hold a JSON object", what);
  return parsed;
}

Status unsupported(std::string feature) { return Status::error(ErrorCode::kUnsupported, "unsupported " + feature); }

// Prefix and suffix ids a post-processor adds around a single sequence.
Status add_post_processor(const json& config, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (config.is_null()) return Status::ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return Status::error("post_processor must be an object with a string \"type\"");
  }
  const std::string type = config["type"];
  std::vector<int32_t> before, after;
  if (type == "ByteLevel") {
    return Status::ok();  // trims offsets only
  } else if (type == "Sequence") {
    if (!config.contains("processors") || !config["processors"].is_array()) {
      return Status::error("post_processor Sequence needs an array \"processors\"");
    }
    for (const auto& child : config["processors"]) SY_TRY(add_post_processor(child, prefix, suffix));
    return Status::ok();
  } else if (type == "TemplateProcessing") {
    const auto& single = config.value("single", json());
    const auto& special_tokens = config.value("special_tokens", json::object());
    if (!single.is_array()) return Status::error("TemplateProcessing needs an array \"single\"");
    int sequences = 0;
    for (const auto& item : single) {
      if (!item.is_object())
        return Status::error("TemplateProcessing items must be Sequence or SpecialToken");
      if (item.contains("Sequence")) {
        if (!item["Sequence"].is_object() || item["Sequence"].value("id", json()) != "A") {
          return Status::error("TemplateProcessing \"single\" may only hold sequence A");
        }
        ++sequences;
      } else if (item.contains("SpecialToken")) {
        if (!item["SpecialToken"].is_object())
          return Status::error(
              "TemplateProcessing SpecialToken must be an object with a string \"id\"");
        SY_ASSIGN(const std::string name,
                  optional_string(item["SpecialToken"], "id", "TemplateProcessing SpecialToken"));
        if (!special_tokens.is_object() || !special_tokens.contains(name) ||
            !special_tokens[name].is_object() || !special_tokens[name].contains("ids") ||
            !special_tokens[name]["ids"].is_array()) {
          return Status::errorf("TemplateProcessing special token {:?} is not in \"special_tokens\"", name);
        }
        for (const auto& id : special_tokens[name]["ids"]) {
          SY_ASSIGN(const int32_t token,
                    token_id(id, fmt::format("TemplateProcessing {:?} id", name)));
          (sequences == 0 ? before : after).push_back(token);
        }
      } else {
        return Status::error("TemplateProcessing items must be Sequence or SpecialToken");
      }
    }
    if (sequences != 1) return Status::error("TemplateProcessing \"single\" must hold sequence A exactly once");
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const auto& pair = config.value(key, json());
      if (!pair.is_array() || pair.size() != 2)
        return Status::errorf("{} needs \"{}\": [token, id]", type, key);
      SY_ASSIGN(const int32_t token, token_id(pair[1], fmt::format("{} {}", type, key)));
      (std::string(key) == "cls" ? before : after).push_back(token);
    }
  } else {
    return unsupported(fmt::format("post_processor type {:?} (supported: ByteLevel, TemplateProcessing, "
                                   "BertProcessing, RobertaProcessing, Sequence)", type));
  }
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
  return Status::ok();
}

Status read_added_tokens(const json& config, std::vector<AddedToken>& added) {
  if (config.is_null()) return Status::ok();
  if (!config.is_array()) return Status::error("added_tokens must be an array");
  for (const auto& entry : config) {
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        !entry.contains("content") || !entry["content"].is_string()) {
      return Status::error("each added token needs an integer \"id\" and a string \"content\"");
    }
    AddedToken token;
    const std::string where = fmt::format("added token {:?}", entry["content"].get<std::string>());
    SY_ASSIGN(token.id, token_id(entry["id"], where + " id"));
    token.content = entry["content"];
    SY_ASSIGN(token.single_word, optional_bool(entry, "single_word", false, where));
    SY_ASSIGN(token.lstrip, optional_bool(entry, "lstrip", false, where));
    SY_ASSIGN(token.rstrip, optional_bool(entry, "rstrip", false, where));
    SY_ASSIGN(token.normalized, optional_bool(entry, "normalized", true, where));
    SY_ASSIGN(token.special, optional_bool(entry, "special", false, where));
    if (utf8::first_invalid(token.content) != std::string_view::npos) {
      return Status::errorf("added token {} is not valid UTF-8", token.id);
    }
    if (token.content.empty()) continue;  // HF ignores these
    added.push_back(std::move(token));
  }
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  SY_ASSIGN(const std::string tokenizer_json, read_file(model_dir + "/tokenizer.json"));
  std::string config_json;
  if (std::ifstream(model_dir + "/tokenizer_config.json")) {
    SY_ASSIGN(config_json, read_file(model_dir + "/tokenizer_config.json"));
  }
  auto loaded = from_json(tokenizer_json, config_json);
  if (!loaded) return loaded.status().with_context(model_dir + ": ");
  return loaded;
}

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  // Every field is type-checked where it is read; a check missed there is still an error naming
  // the file, not a crash (nlohmann throws on a field of the wrong type).
  auto build = [&]() -> Result<Tokenizer> {
    SY_ASSIGN(const json root, parse_json(tokenizer_json, "tokenizer.json"));
    auto impl = std::make_shared<Impl>();
    if (!tokenizer_config_json.empty()) {
      SY_ASSIGN(impl->config, parse_json(tokenizer_config_json, "tokenizer_config.json"));
    }
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null())
        return unsupported(fmt::format("tokenizer.json {:?} setting", key));
    }

    const auto& model = root.value("model", json());
    if (!model.is_object()) return Status::error("tokenizer.json needs an object \"model\"");
    SY_ASSIGN(std::string model_type, optional_string(model, "type", "model"));
    if (model_type.empty() && model.contains("merges")) model_type = "BPE";
    if (model_type != "BPE")
      return unsupported(fmt::format("model type {:?} (supported: BPE)", model_type));
    SY_ASSIGN(impl->model, Bpe::from_json(model));
    SY_ASSIGN(impl->normalizer, Normalizer::from_json(root.value("normalizer", json())));
    SY_ASSIGN(impl->pre_tokenizer, PreTokenizer::from_json(root.value("pre_tokenizer", json())));
    SY_TRY(add_post_processor(root.value("post_processor", json()), impl->prefix_ids,
                              impl->suffix_ids));

    const auto& decoder = root.value("decoder", json());
    if (decoder.is_object() && decoder.value("type", json()) == "ByteLevel") {
      impl->byte_level_decoder = true;
    } else if (!decoder.is_null()) {
      return unsupported(fmt::format("decoder {:?} (supported: ByteLevel, none)",
                                     !decoder.is_object() ? decoder.dump()
                                     : decoder.value("type", json()).is_string()
                                         ? decoder["type"].get<std::string>()
                                         : std::string("?")));
    }

    SY_TRY(read_added_tokens(root.value("added_tokens", json()), impl->added));
    int64_t max_id = impl->model->max_id();
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const AddedToken& token = impl->added[i];
      impl->added_spelling.push_back(token.normalized ? impl->normalizer.normalize(token.content)
                                                      : token.content);
      impl->added_by_id[token.id] = i;
      impl->added_by_content[token.content] = token.id;
      max_id = std::max<int64_t>(max_id, token.id);
    }
    impl->vocab_size = max_id + 1;
    // HF matches special tokens first, then the others; the first of equal patterns wins.
    std::vector<std::string> raw_patterns, normalized_patterns;
    std::vector<const AddedToken*> raw_tokens, normalized_tokens;
    for (const bool special_pass : {true, false}) {
      for (const AddedToken& token : impl->added) {
        if (token.special != special_pass) continue;
        if (token.normalized) {
          normalized_patterns.push_back(impl->normalizer.normalize(token.content));
          normalized_tokens.push_back(&token);
        } else {
          raw_patterns.push_back(token.content);
          raw_tokens.push_back(&token);
        }
      }
    }
    impl->raw_matcher.build(raw_patterns, raw_tokens);
    impl->normalized_matcher.build(normalized_patterns, normalized_tokens);

    // Per id: the bytes it decodes to (ByteLevel maps each character back to its byte unless the
    // token holds a character outside the map, then the token's own UTF-8 is used) and speciality.
    std::unordered_map<char32_t, uint8_t> byte_of_char;
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      byte_of_char[utf8::next(chars[b], pos)] = static_cast<uint8_t>(b);
    }
    std::unordered_set<std::string_view> special_contents;
    for (const AddedToken& token : impl->added) {
      if (token.special) special_contents.insert(token.content);
    }
    impl->token_bytes.resize(static_cast<size_t>(impl->vocab_size));
    impl->special.resize(static_cast<size_t>(impl->vocab_size));
    for (int32_t id = 0; id < impl->vocab_size; ++id) {
      const std::string* token = impl->token_for_id(id);
      if (!token) continue;
      impl->special[id] = special_contents.count(*token) ? 1 : 0;
      if (!impl->byte_level_decoder) {
        impl->token_bytes[id] = *token;
        continue;
      }
      std::string bytes;
      size_t pos = 0;
      bool all_mapped = true;
      while (pos < token->size() && all_mapped) {
        const auto it = byte_of_char.find(utf8::next(*token, pos));
        if (it == byte_of_char.end())
          all_mapped = false;
        else
          bytes.push_back(static_cast<char>(it->second));
      }
      impl->token_bytes[id] = all_mapped ? std::move(bytes) : *token;
    }

    Tokenizer tokenizer;
    tokenizer.impl_ = std::move(impl);
    return tokenizer;
  };
  try {
    return build();
  } catch (const json::exception& e) {
    return Status::errorf("tokenizer.json: a field has the wrong type ({})", e.what());
  }
}

const std::string* Tokenizer::Impl::token_for_id(int32_t id) const {
  const auto it = added_by_id.find(id);
  if (it != added_by_id.end()) return &added_spelling[it->second];
  return model->id_to_token(id);
}

void Tokenizer::Impl::encode_valid(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids) const {
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
  std::vector<Piece> raw_pieces, normalized_pieces;
  std::vector<std::string> words;
  raw_matcher.split(text, raw_pieces);
  for (const Piece& raw : raw_pieces) {
    if (raw.added_id >= 0) {
      ids.push_back(raw.added_id);
      continue;
    }
    const std::string normalized = normalizer.normalize(raw.text);
    normalized_pieces.clear();
    normalized_matcher.split(normalized, normalized_pieces);
    for (const Piece& piece : normalized_pieces) {
      if (piece.added_id >= 0) {
        ids.push_back(piece.added_id);
        continue;
      }
      words.clear();
      pre_tokenizer.pre_tokenize(piece.text, words);
      for (const std::string& word : words) model->tokenize(word, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
}

Result<std::vector<int32_t>> Tokenizer::try_encode(std::string_view text, bool add_special_tokens) const {
  const size_t invalid = utf8::first_invalid(text);
  if (invalid != std::string_view::npos) {
    return Status::errorf("text is not valid UTF-8: byte 0x{:02X} at offset {}",
                          static_cast<unsigned char>(text[invalid]), invalid);
  }
  std::vector<int32_t> ids;
  impl_->encode_valid(text, add_special_tokens, ids);
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (utf8::first_invalid(text) == std::string_view::npos) {
    impl_->encode_valid(text, add_special_tokens, ids);
  } else {
    impl_->encode_valid(utf8::lossy(text), add_special_tokens, ids);
  }
  return ids;
}

std::string_view Tokenizer::token_bytes(int32_t id, bool skip_special_tokens) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  if (skip_special_tokens && impl_->special[id]) return {};
  return impl_->token_bytes[id];
}

bool Tokenizer::joins_with_spaces() const { return !impl_->byte_level_decoder; }

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (const int32_t id : ids) {
    if (id < 0 || id >= impl_->vocab_size || !impl_->token_for_id(id)) continue;
    if (skip_special_tokens && impl_->special[id]) continue;
    if (!impl_->byte_level_decoder && !first) bytes.push_back(' ');
    bytes.append(impl_->token_bytes[id]);
    first = false;
  }
  return impl_->byte_level_decoder ? utf8::lossy(bytes) : bytes;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->token_for_id(id);
  return token ? *token : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

std::optional<std::string> Tokenizer::config_token(std::string_view key) const {
  const auto it = impl_->config.find(key);
  if (it == impl_->config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

std::string Tokenizer::normalize(std::string_view text) const {
  return impl_->normalizer.normalize(utf8::lossy(text));
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  if (tokenizer_.joins_with_spaces()) {
    if (id < 0 || id >= tokenizer_.vocab_size() || tokenizer_.id_to_token(id).empty()) return {};
    if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
    std::string out = emitted_any_ ? " " : "";
    out.append(tokenizer_.token_bytes(id, skip_special_tokens_));
    emitted_any_ = true;
    return out;
  }
  pending_.append(tokenizer_.token_bytes(id, skip_special_tokens_));
  // Return every complete character; replace invalid bytes now (their fate cannot change), but
  // hold back a valid-so-far sequence cut short by the end of the buffer.
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t subpart = 0;
    const size_t length = utf8::valid_sequence_length(pending_, pos, &subpart);
    if (length) {
      out.append(pending_, pos, length);
      pos += length;
      continue;
    }
    const auto lead = static_cast<unsigned char>(pending_[pos]);
    if (lead >= 0xC2 && lead <= 0xF4 && pos + subpart == pending_.size()) break;  // may still complete
    out.append("\xEF\xBF\xBD");
    pos += subpart;
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace sy::tokenizer
