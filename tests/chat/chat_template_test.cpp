// Loading, refusal of unsupported constructs, limits against hostile templates, thread safety and
// the render-chat command.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"

namespace sy::chat {
namespace {

using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const std::string kChatDir = std::string(SY_SOURCE_DIR) + "/tests/chat";

const ordered_json kHello = ordered_json::parse(R"([{"role": "user", "content": "Hello"}])");

Result<std::string> render(const std::string& source, const ordered_json& messages = kHello,
                           const ordered_json& kwargs = nullptr) {
  auto t = ChatTemplate::parse(source, "<s>", "</s>");
  if (!t) return t.status();
  return t->render_ordered(messages, nullptr, true, kwargs);
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::path(SY_BINARY_DIR) / "chat_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ChatTemplateLoad, PicksDefaultFromTemplateListAndReadsAddedTokens) {
  fs::path dir = temp_dir("list");
  write(dir / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<B>", "lstrip": false},
    "eos_token": "<E>", "pad_token": null,
    "chat_template": [{"name": "tool_use", "template": "TOOLS"},
                      {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}|{{ pad_token is defined }}"}]})");
  auto t = ChatTemplate::load(dir.string());
  ASSERT_TRUE(t) << t.message();
  auto out = t->render_ordered(kHello, nullptr, false, nullptr);
  ASSERT_TRUE(out) << out.message();
  EXPECT_EQ(*out, "<B>Hello<E>|False");
}

TEST(ChatTemplateLoad, ChatTemplateJinjaWinsOverTokenizerConfig) {
  fs::path dir = temp_dir("jinja_wins");
  write(dir / "tokenizer_config.json", R"({"chat_template": "from config", "eos_token": "</s>"})");
  write(dir / "chat_template.jinja", "from jinja {{ eos_token }}\n");
  auto t = ChatTemplate::load(dir.string());
  ASSERT_TRUE(t) << t.message();
  EXPECT_EQ(*t->render_ordered(kHello, nullptr, false, nullptr),
            "from jinja </s>");  // trailing newline dropped
}

TEST(ChatTemplateLoad, ErrorsNameTheProblem) {
  fs::path dir = temp_dir("none");
  write(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto missing = ChatTemplate::load(dir.string());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.message().find("no chat template"), std::string::npos) << missing.message();
  write(dir / "tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  auto no_default = ChatTemplate::load(dir.string());
  ASSERT_FALSE(no_default);
  EXPECT_NE(no_default.message().find("no \"default\" entry (has: rag)"), std::string::npos)
      << no_default.message();
  write(dir / "tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}{{ m | bogus }}{% endfor %}"})");
  auto bad = ChatTemplate::load(dir.string());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("line 1: unknown filter 'bogus'"), std::string::npos)
      << bad.message();
}

TEST(ChatTemplateLoad, QwenHasNoBosTokenVariable) {
  auto t = ChatTemplate::load(kChatDir + "/models/qwen3");
  ASSERT_TRUE(t) << t.message();
  for (const auto& [name, text] : t->special_tokens()) EXPECT_NE(name, "bos_token") << text;
}

TEST(ChatTemplateSubset, UnsupportedConstructsFailAtLoadNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% include 'x' %}", "'{% include %}' tag is not supported"},
      {"{% call m() %}x{% endcall %}", "'{% call %}' tag is not supported"},
      {"{% filter upper %}x{% endfilter %}", "'{% filter %}' tag is not supported"},
      {"{% raw %}x{% endraw %}", "'{% raw %}' tag is not supported"},
      {"{{ x | format(1) }}", "unknown filter 'format'"},
      {"{{ x is no_such_test }}", "unknown test 'no_such_test'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
      {"{{ f(*args) }}", "'*args' / '**kwargs' in calls are not supported"},
      {"{% break %}", "'break' outside a for loop"},
      {"{% if x %}", "unexpected end of template; expected 'elif' or 'else' or 'endif'"},
      {"{{ 'abc }}", "unterminated string literal"},
      {"{{ 99999999999999999999 }}", "too large"},
      {"\xff{{ x }}", "not valid UTF-8"},
  };
  for (const auto& [source, expected] : cases) {
    auto t = ChatTemplate::parse(source, "", "");
    ASSERT_FALSE(t) << source;
    EXPECT_NE(t.message().find(expected), std::string::npos) << source << " -> " << t.message();
  }
}

TEST(ChatTemplateSubset, UnsupportedOperationsFailAtRenderNeverRenderDifferently) {
  const std::pair<const char*, const char*> cases[] = {
      {"{{ '%s!' % 'x' }}", "'%' string formatting is not supported"},
      {"{{ '{}'.format(1) }}", "str.format() is not supported"},
      {"{{ messages[0].content | upper }}{{ 'é' | upper }}", "non-ASCII"},
      {"{{ messages | map(attribute='role') }}", "printing a generator"},
      {"{{ ('a' | safe) + 'b' }}", "Markup"},
      {"{{ messages.__class__ }}", "not supported (sandboxed)"},
      {"{% set l = [] %}{{ l.append(1) }}", "unsafe (sandboxed)"},
      {"{{ raise_exception('custom failure') }}",
       "the chat template raised an error: custom failure"},
      {"{{ messages[0].missing.deeper }}", "'dict object' has no attribute 'missing'"},
  };
  for (const auto& [source, expected] : cases) {
    auto out = render(source);
    ASSERT_FALSE(out) << source << " rendered " << *out;
    EXPECT_NE(out.message().find(expected), std::string::npos) << source << " -> " << out.message();
  }
}

TEST(ChatTemplateLimits, HostileTemplatesStopWithAnError) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
       "loop iterations"},
      {"{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% "
       "endfor %}",
       "bytes"},
      {"{{ 'x' * 1000000000 }}", "string repetition would exceed"},
      {"{{ [1] * 1000000000 }}", "list repetition would exceed"},
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls nested deeper than 64"},
      {"{{ range(1000000) | list }}", "MAX_RANGE"},
      {"{{ 2 ** 64 }}", "integer overflow"},
  };
  for (const auto& [source, expected] : cases) {
    auto out = render(source);
    ASSERT_FALSE(out) << source;
    EXPECT_NE(out.message().find(expected), std::string::npos) << source << " -> " << out.message();
  }
  std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
  auto parens = ChatTemplate::parse("{{ " + deep + " }}", "", "");
  ASSERT_FALSE(parens);
  EXPECT_NE(parens.message().find("nested more than 100 levels"), std::string::npos)
      << parens.message();
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  auto nested_ifs = ChatTemplate::parse(blocks, "", "");
  ASSERT_FALSE(nested_ifs);
  EXPECT_NE(nested_ifs.message().find("nested more than 100 levels"), std::string::npos)
      << nested_ifs.message();
}

TEST(ChatTemplateRender, InputsAreValidatedLikeTransformers) {
  auto t = ChatTemplate::parse("{{ messages | length }}", "", "");
  ASSERT_TRUE(t);
  EXPECT_FALSE(
      t->render_ordered(ordered_json::array(), nullptr, true, nullptr));  // empty conversation
  EXPECT_FALSE(t->render_ordered(ordered_json::object(), nullptr, true, nullptr));
  EXPECT_FALSE(t->render_ordered(kHello, ordered_json::object(), true, nullptr));
  auto reserved = t->render_ordered(kHello, nullptr, true, {{"messages", 1}});
  ASSERT_FALSE(reserved);
  EXPECT_NE(reserved.message().find("may not set 'messages'"), std::string::npos);
  auto kwargs = render("{{ enable_thinking }}/{{ bos_token }}", kHello,
                       {{"enable_thinking", false}, {"bos_token", "B"}});
  ASSERT_TRUE(kwargs) << kwargs.message();
  EXPECT_EQ(*kwargs,
            "False/B");  // kwargs override special tokens, as {**special_tokens_map, **kwargs}
}

TEST(ChatTemplateRender, OrderedJsonKeepsToolKeyOrderPlainJsonSortsIt) {
  auto t = ChatTemplate::parse("{{ tools[0] | tojson }}", "", "");
  ASSERT_TRUE(t);
  const char* tool = R"([{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(*t->render_ordered(kHello, ordered_json::parse(tool), true, nullptr),
            R"({"type": "function", "function": {"name": "f"}})");
  EXPECT_EQ(*t->render(nlohmann::json(kHello), nlohmann::json::parse(tool), true, nullptr),
            R"({"function": {"name": "f"}, "type": "function"})");
}

TEST(ChatTemplateRender, ConcurrentRendersAgree) {
  auto t = ChatTemplate::load(kChatDir + "/models/gpt_oss");
  ASSERT_TRUE(t) << t.message();
  const ordered_json conversations =
      ordered_json::parse(std::ifstream(kChatDir + "/conversations.json"));
  const ordered_json& c = conversations["cases"][14];  // tool_call_roundtrip_dict_args
  RenderOptions options;
  options.now = std::tm{};
  options.now->tm_year = 124;
  options.now->tm_mday = 1;
  auto expected = t->render_ordered(c["messages"], c["tools"], true, c["kwargs"], options);
  ASSERT_TRUE(expected) << expected.message();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        auto out = t->render_ordered(c["messages"], c["tools"], true, c["kwargs"], options);
        if (!out || *out != *expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

std::string run(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer;
  size_t n;
  while (pipe && (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    out.append(buffer.data(), n);
  status = pipe ? pclose(pipe) : -1;
  return out;
}

TEST(RenderChatCommand, PrintsTheGoldenPrompt) {
  const char* bin = std::getenv("SWITCHYARD_BIN");
  ASSERT_NE(bin, nullptr) << "SWITCHYARD_BIN not set (run under ctest)";
  const ordered_json goldens = ordered_json::parse(std::ifstream(kChatDir + "/chat_goldens.json"));
  const ordered_json conversations =
      ordered_json::parse(std::ifstream(kChatDir + "/conversations.json"));
  const ordered_json& c =
      conversations["cases"][14];  // tool_call_roundtrip_dict_args: tojson key order
  std::string want;
  for (const auto& row : goldens["renders"])
    if (row["template"] == "qwen3" && row["case"] == c["name"]) want = row["output"];
  ASSERT_FALSE(want.empty());
  fs::path request = temp_dir("cli") / "request.json";
  write(request, ordered_json({{"messages", c["messages"]},
                               {"tools", c["tools"]},
                               {"add_generation_prompt", c["add_generation_prompt"]},
                               {"chat_template_kwargs", c["kwargs"]}})
                     .dump());
  int status = 0;
  std::string out = run(
      std::string(bin) + " render-chat --model " + kChatDir + "/models/qwen3 < " + request.string(),
      status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out, want);
  write(request, R"({"messages": [], "oops": 1})");
  out = run(std::string(bin) + " render-chat --model " + kChatDir + "/models/qwen3 < " +
                request.string() + " 2>&1",
            status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("unknown field 'oops'"), std::string::npos) << out;
}

}  // namespace
}  // namespace sy::chat
