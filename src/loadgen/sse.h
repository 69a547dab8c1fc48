// Incremental Server-Sent Events parser (WHATWG "event stream" rules): bytes arrive in arbitrary
// pieces, events come out whole. Only `data` (and `event`) fields matter to a load generator.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sy::loadgen {

struct SseEvent {
  std::string event;  // the `event:` field; empty means "message"
  std::string data;   // `data:` lines joined by '\n'
};

class SseParser {
 public:
  // Consumes a piece of the stream; returns the events it completed (possibly none).
  // Lines end in "\n", "\r\n" or "\r", even when the ending is split across pieces.
  std::vector<SseEvent> feed(std::string_view bytes);
  // End of stream: an event whose blank line never came is still returned when it has data
  // (servers that end on "data: [DONE]\n" exist; vLLM's client accepts them too).
  std::vector<SseEvent> finish();
  // Bytes held that do not yet form a complete line.
  size_t pending_bytes() const { return line_.size(); }

 private:
  void take_line(std::vector<SseEvent>& events);
  std::string line_;
  std::string data_;
  std::string event_;
  bool has_data_ = false;
  bool skip_lf_ = false;  // the previous piece ended in '\r': a leading '\n' belongs to it
  bool at_start_ = true;  // a UTF-8 byte-order mark at the very start is ignored
};

}  // namespace sy::loadgen
