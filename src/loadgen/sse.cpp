#include "loadgen/sse.h"

namespace sy::loadgen {

std::vector<SseEvent> SseParser::feed(std::string_view bytes) {
  std::vector<SseEvent> events;
  size_t position = 0;
  if (skip_lf_ && !bytes.empty()) {
    if (bytes[0] == '\n') position = 1;
    skip_lf_ = false;
  }
  while (position < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", position);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(position));
      break;
    }
    line_.append(bytes.substr(position, end - position));
    take_line(events);
    position = end + 1;
    if (bytes[end] == '\r') {
      if (position < bytes.size()) {
        if (bytes[position] == '\n') ++position;
      } else {
        skip_lf_ = true;
      }
    }
  }
  return events;
}

std::vector<SseEvent> SseParser::finish() {
  std::vector<SseEvent> events;
  if (!line_.empty()) take_line(events);
  if (has_data_) {
    events.push_back(SseEvent{std::move(event_), std::move(data_)});
  }
  data_.clear();
  event_.clear();
  has_data_ = false;
  skip_lf_ = false;
  return events;
}

void SseParser::take_line(std::vector<SseEvent>& events) {
  std::string_view line = line_;
  if (at_start_) {
    at_start_ = false;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  }
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) events.push_back(SseEvent{std::move(event_), std::move(data_)});
    data_.clear();
    event_.clear();
    has_data_ = false;
  } else if (line[0] != ':') {  // ':' starts a comment (keep-alive pings)
    const size_t colon = line.find(':');
    std::string_view field = line.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    } else if (field == "event") {
      event_.assign(value);
    }
  }
  line_.clear();
}

}  // namespace sy::loadgen
