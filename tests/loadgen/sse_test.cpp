// SSE parsing as servers really send it: pieces cut anywhere (inside "data:", inside JSON,
// between '\r' and '\n'), CRLF/CR/LF endings, comments (pings), multi-line data, no final blank.
#include "loadgen/sse.h"

#include <gtest/gtest.h>

namespace sy::loadgen {
namespace {

std::vector<std::string> datas(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& event : events) out.push_back(event.data);
  return out;
}

const std::vector<std::string> kExpected = {R"({"choices":[{"text":"a"}]})", R"({"choices":[{"text":"b\n"}]})",
                                            "line one\nline two", "[DONE]"};

std::string stream_with(const std::string& newline) {
  return ": ping" + newline + "data: " + kExpected[0] + newline + newline + "event: delta" + newline +
         "data:" + kExpected[1].substr(0) + newline + newline + "id: 3" + newline +
         "data: line one" + newline + "data: line two" + newline + newline + "data: [DONE]" +
         newline + newline;
}

TEST(SseParser, WholeStream) {
  for (const std::string newline : {"\n", "\r\n", "\r"}) {
    SseParser parser;
    std::vector<SseEvent> events = parser.feed(stream_with(newline));
    auto tail = parser.finish();
    events.insert(events.end(), tail.begin(), tail.end());
    EXPECT_EQ(datas(events), kExpected) << "newline length " << newline.size();
    ASSERT_EQ(events.size(), 4u);
    EXPECT_EQ(events[1].event, "delta");
    EXPECT_EQ(events[0].event, "");
  }
}

TEST(SseParser, EverySplitIntoTwoAndThreePieces) {
  for (const std::string newline : {"\n", "\r\n", "\r"}) {
    const std::string stream = stream_with(newline);
    for (size_t cut = 0; cut <= stream.size(); ++cut) {
      for (size_t cut2 = cut; cut2 <= stream.size(); cut2 += 5) {
        SseParser parser;
        std::vector<SseEvent> events;
        for (auto piece : {stream.substr(0, cut), stream.substr(cut, cut2 - cut), stream.substr(cut2)}) {
          auto got = parser.feed(piece);
          events.insert(events.end(), got.begin(), got.end());
        }
        auto tail = parser.finish();
        events.insert(events.end(), tail.begin(), tail.end());
        ASSERT_EQ(datas(events), kExpected) << "cuts " << cut << "," << cut2 << " newline " << newline.size();
      }
    }
  }
}

TEST(SseParser, ByteAtATime) {
  const std::string stream = stream_with("\r\n");
  SseParser parser;
  std::vector<SseEvent> events;
  for (char byte : stream) {
    auto got = parser.feed(std::string(1, byte));
    events.insert(events.end(), got.begin(), got.end());
  }
  EXPECT_EQ(datas(events), kExpected);  // all dispatched before finish()
  EXPECT_TRUE(parser.finish().empty());
}

TEST(SseParser, EventsAreDispatchedOnlyAtTheBlankLine) {
  SseParser parser;
  EXPECT_TRUE(parser.feed("data: {\"a\":1}\n").empty());  // no blank line yet
  EXPECT_TRUE(parser.feed("data: more").empty());
  auto events = parser.feed("\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "{\"a\":1}\nmore");
}

TEST(SseParser, FinishReturnsAnUnterminatedEvent) {
  SseParser parser;
  EXPECT_TRUE(parser.feed("data: [DONE]").empty());
  auto events = parser.finish();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "[DONE]");
}

TEST(SseParser, FieldRules) {
  SseParser parser;
  // Only one leading space is stripped; no colon means the whole line is the field name;
  // unknown fields and comments are ignored; a leading BOM is dropped.
  auto events = parser.feed("\xEF\xBB\xBF" "data:  two spaces\nretry: 10\nfoo\n:comment\n\ndata\n\n");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].data, " two spaces");
  EXPECT_EQ(events[1].data, "");
  EXPECT_TRUE(parser.feed(": only a ping\n\n").empty());
}

}  // namespace
}  // namespace sy::loadgen
