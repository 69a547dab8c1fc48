// The model's own tokenizer.json and chat template behind the server's TextCodec (what `serve`
// attaches; the serve fuzz target too).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace sy::server {

// The model's own tokenizer.json and chat_template behind the server's TextCodec.
class ModelCodec : public TextCodec {
 public:
  ModelCodec(tokenizer::Tokenizer tokenizer, std::optional<chat::ChatTemplate> chat_template,
             std::string chat_template_error)
      : tokenizer_(std::move(tokenizer)),
        chat_template_(std::move(chat_template)),
        chat_template_error_(std::move(chat_template_error)) {}

  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special) const override {
    return tokenizer_.try_encode(text, add_special);  // rejects invalid UTF-8
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return tokenizer_.decode(ids, skip_special);
  }
  std::string token_text(int32_t id) const override { return tokenizer_.id_to_token(id); }
  class Stream : public TokenStream {
   public:
    Stream(const tokenizer::Tokenizer& tokenizer, bool skip) : decoder_(tokenizer, skip) {}
    std::string push(int32_t id) override { return decoder_.push(id); }
    std::string flush() override { return decoder_.flush(); }

   private:
    tokenizer::StreamDecoder decoder_;
  };
  std::unique_ptr<TokenStream> stream(bool skip_special) const override {
    return std::make_unique<Stream>(tokenizer_, skip_special);
  }
  Result<std::string> render_chat(const nlohmann::ordered_json& messages,
                                  const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra_kwargs) const override {
    if (!chat_template_) {
      return Status::error(
          ErrorCode::kInvalidArgument,
          "this model has no chat template (" + chat_template_error_ + "); use /v1/completions");
    }
    return chat_template_->render_ordered(messages, tools, add_generation_prompt, extra_kwargs);
  }

 private:
  tokenizer::Tokenizer tokenizer_;
  std::optional<chat::ChatTemplate> chat_template_;
  std::string chat_template_error_;
};

}  // namespace sy::server
