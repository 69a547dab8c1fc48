// Structure-aware mutation for libFuzzer targets whose input is a JSON file: byte mutations of
// JSON text mostly break its syntax and stop at the parser, so a target can read its input as
// edits of a known-good document instead. Each edit is 4 bytes: which node (two bytes, an index
// into every node of the document in document order), what to put there and a value byte (small,
// negative, huge, fractional, near the old value, null, a string from the target's dictionary, an
// array, an object, the old string cut or doubled, or the node deleted: a key from its object, an
// array's last element from its array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sy::fuzz {

inline void list_json_nodes(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                            std::vector<nlohmann::json::json_pointer>& out) {
  if (!at.empty()) out.push_back(at);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) list_json_nodes(it.value(), at / it.key(), out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) list_json_nodes(j[i], at / i, out);
}

inline std::vector<nlohmann::json::json_pointer> json_nodes(const nlohmann::json& j) {
  std::vector<nlohmann::json::json_pointer> out;
  list_json_nodes(j, nlohmann::json::json_pointer(), out);
  return out;
}

// `doc` with the edits in edits[0, size) applied; `nodes` = json_nodes(doc); `words` are the
// strings an edit may write (the format's own keywords reach more code than random text).
inline nlohmann::json apply_json_edits(nlohmann::json doc,
                                       const std::vector<nlohmann::json::json_pointer>& nodes,
                                       const std::vector<std::string>& words, const uint8_t* edits,
                                       size_t size) {
  if (nodes.empty()) return doc;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    const auto& at = nodes[(static_cast<size_t>(edits[i]) << 8 | edits[i + 1]) % nodes.size()];
    const uint8_t b = edits[i + 3];
    if (!doc.contains(at)) continue;  // under a node an earlier edit replaced or deleted
    nlohmann::json& node = doc[at];
    switch (edits[i + 2] % 13) {
      case 0:
        node = b;
        break;
      case 1:
        node = -static_cast<int64_t>(b) - 1;
        break;
      case 2:
        node = static_cast<int64_t>(b) * 1000003;
        break;
      case 3:
        node = (int64_t{1} << 62) + b;
        break;
      case 4:
        node = b / 7.0;
        break;
      case 5:  // near the old value: 0..4 times it, then -1, 0 or +1
        if (int64_t v = 0;
            node.is_number_integer() && !__builtin_mul_overflow(node.get<int64_t>(), b % 5, &v))
          node = v + (b % 3) - 1;
        else if (node.is_number_float())
          node = node.get<double>() * (b % 5) + (b % 3) - 1;
        break;
      case 6:
        node = nullptr;
        break;
      case 7:
        node = words.empty() ? std::string(b % 4, 'x') : words[b % words.size()];
        break;
      case 8:
        node = nlohmann::json::array({b});
        break;
      case 9:
        node = b % 2 == 1;
        break;
      case 10:
        node = nlohmann::json::object();
        break;
      case 11:  // a string of the old one's text, cut or doubled (up to 4 KiB)
        if (node.is_string()) {
          std::string s = node.get<std::string>();
          node = b % 2 || s.size() > 4096 ? s.substr(0, b % (s.size() + 1)) : s + s;
        }
        break;
      case 12:
        if (nlohmann::json& parent = doc[at.parent_pointer()]; parent.is_object())
          parent.erase(at.back());
        else if (parent.is_array() && !parent.empty())
          parent.erase(parent.size() - 1);
        break;
    }
  }
  return doc;
}

}  // namespace sy::fuzz
