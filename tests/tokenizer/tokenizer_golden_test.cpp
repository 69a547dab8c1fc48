// Our ids against HF `tokenizers` 0.23.2 (goldens made on the GPU machine by
// tools/gpu/tokenizer_goldens.py) for every string of tests/tokenizer/corpus.jsonl, on the real
// Qwen3, gpt-oss, Llama 3 and DeepSeek-V3 files and on two small tokenizers trained there.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace sy::tokenizer {
namespace {

using nlohmann::json;

struct CorpusRow {
  int id;
  std::string category;
  std::string text;
};

const std::vector<CorpusRow>& corpus() {
  static const std::vector<CorpusRow> rows = [] {
    std::vector<CorpusRow> out;
    std::ifstream in(std::string(SY_SOURCE_DIR) + "/tests/tokenizer/corpus.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const json row = json::parse(line);
      out.push_back({row["id"].get<int>(), row["category"].get<std::string>(), row["text"].get<std::string>()});
    }
    return out;
  }();
  return rows;
}

std::vector<json> goldens(const std::string& name) {
  std::vector<json> out;
  std::ifstream in(std::string(SY_SOURCE_DIR) + "/tests/tokenizer/goldens/" + name + ".jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

std::string show(const std::vector<int32_t>& ids) { return json(ids).dump(); }

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EveryCorpusStringMatchesHuggingFace) {
  const std::string name = GetParam();
  const Tokenizer* loaded = test::load_tokenizer(name);
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tokenizer = *loaded;
  const auto& rows = corpus();
  const auto expected = goldens(name);
  ASSERT_GE(rows.size(), 2000u);
  ASSERT_EQ(expected.size(), rows.size()) << "goldens/" << name << ".jsonl is out of step with corpus.jsonl";

  std::map<std::string, std::pair<int, int>> per_category;  // category -> (equal, total)
  int failures_shown = 0;
  int ids_equal = 0, decode_equal = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const CorpusRow& row = rows[i];
    const json& golden = expected[i];
    ASSERT_EQ(golden["id"].get<int>(), row.id);
    const auto want = golden["ids"].get<std::vector<int32_t>>();
    const auto want_plain = golden.contains("ids_plain") ? golden["ids_plain"].get<std::vector<int32_t>>() : want;
    const auto got = tokenizer.encode(row.text, true);
    const auto got_plain = tokenizer.encode(row.text, false);
    const bool same = got == want && got_plain == want_plain;
    ids_equal += same;
    auto& [equal, total] = per_category[row.category];
    equal += same;
    ++total;
    if (!same && failures_shown++ < 5) {
      ADD_FAILURE() << name << " row " << row.id << " (" << row.category << ") " << json(row.text).dump()
                    << "\n  HF:   " << show(want) << "\n  ours: " << show(got)
                    << "\n  HF (no special):   " << show(want_plain) << "\n  ours (no special): " << show(got_plain);
    }

    const std::string want_decoded = golden.value("decoded", row.text);
    const std::string want_skip = golden.value("decoded_skip", want_decoded);
    const bool decode_same = tokenizer.decode(want, false) == want_decoded && tokenizer.decode(want, true) == want_skip;
    decode_equal += decode_same;
    if (!decode_same && failures_shown++ < 5) {
      ADD_FAILURE() << name << " row " << row.id << " decode differs: HF " << json(want_decoded).dump() << " ours "
                    << json(tokenizer.decode(want, false)).dump() << "; skip-special HF " << json(want_skip).dump()
                    << " ours " << json(tokenizer.decode(want, true)).dump();
    }
    const std::string want_normalized = golden.value("normalized", row.text);
    if (tokenizer.normalize(row.text) != want_normalized && failures_shown++ < 5) {
      ADD_FAILURE() << name << " row " << row.id << " normalizer differs: HF " << json(want_normalized).dump()
                    << " ours " << json(tokenizer.normalize(row.text)).dump();
    }
  }
  std::string summary;
  for (const auto& [category, counts] : per_category) {
    summary += fmt::format(" {}={}/{}", category, counts.first, counts.second);
  }
  std::printf("[%s] ids equal %d/%zu, decode equal %d/%zu;%s\n", name.c_str(), ids_equal, rows.size(), decode_equal,
              rows.size(), summary.c_str());
  EXPECT_EQ(ids_equal, static_cast<int>(rows.size()));
  EXPECT_EQ(decode_equal, static_cast<int>(rows.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest,
                         ::testing::Values("qwen3", "gptoss", "llama3", "deepseek_v3", "trained_a", "trained_b"));

// decode(encode(s)) gives back the text as the tokenizer normalises it: NFC(s) for Qwen3 (HF's own
// normalize_str output, recorded in the goldens; utf8proc's NFC agrees except on characters newer
// than HF's normalisation tables), s itself for gpt-oss (no normalizer).
TEST(GoldenRoundTrip, QwenGivesNfcAndGptOssGivesTheTextBack) {
  const Tokenizer* qwen_loaded = test::load_tokenizer("qwen3");
  const Tokenizer* gptoss_loaded = test::load_tokenizer("gptoss");
  ASSERT_TRUE(qwen_loaded && gptoss_loaded);
  const Tokenizer& qwen = *qwen_loaded;
  const Tokenizer& gptoss = *gptoss_loaded;
  const auto qwen_goldens = goldens("qwen3");
  ASSERT_EQ(qwen_goldens.size(), corpus().size());
  int checked = 0, changed_by_nfc = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const CorpusRow& row = corpus()[i];
    const std::string hf_nfc = qwen_goldens[i].value("normalized", row.text);
    changed_by_nfc += hf_nfc != row.text;
    EXPECT_EQ(qwen.decode(qwen.encode(row.text)), hf_nfc) << "row " << row.id;
    if (row.category != "recent_unicode") {
      EXPECT_EQ(hf_nfc, test::nfc(row.text)) << "row " << row.id;
    }
    EXPECT_EQ(gptoss.decode(gptoss.encode(row.text)), row.text) << "row " << row.id;
    ++checked;
  }
  EXPECT_GE(checked, 2000);
  EXPECT_GT(changed_by_nfc, 100);  // the corpus really exercises normalisation
}

}  // namespace
}  // namespace sy::tokenizer
