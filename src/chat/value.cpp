#include "chat/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace sy::chat {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
  } else {
    entries.emplace_back(key, std::move(value));
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer != 0;
    case Kind::kFloat:
      return v.number != 0;
    case Kind::kString:
      return !v.text.empty();
    case Kind::kList:
      return v.flavor == ListFlavor::kGenerator || !v.list->empty();
    case Kind::kTuple:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->entries.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.text == b.text;
    case Kind::kList:
    case Kind::kTuple: {
      if (a.flavor != b.flavor) return false;
      if (a.flavor == ListFlavor::kGenerator) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [key, value] : a.dict->entries) {
        const Value* other = b.dict->find(key);
        if (!other || !equal(value, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return a.dict == b.dict;
    case Kind::kCallable:
      return a.function == b.function;
    default:
      return false;
  }
}

Result<bool> less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string())
    return a.text < b.text;  // UTF-8 byte order = code point order
  if (a.is_sequence() && a.kind == b.kind) {
    const auto& x = *a.list;
    const auto& y = *b.list;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return Status::errorf("'<' not supported between instances of '{}' and '{}'", type_name(a),
                        type_name(b));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific);
  std::string sci(buffer, end);  // "-d.ddde+XX": the shortest digits that round-trip
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e_pos + 1));
  int decimal_point = exponent + 1;  // value = 0.DIGITS * 10^decimal_point
  int n = static_cast<int>(digits.size());
  std::string out;
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out = "0." + std::string(-decimal_point, '0') + digits;
    } else if (decimal_point < n) {
      out = digits.substr(0, decimal_point) + "." + digits.substr(decimal_point);
    } else {
      out = digits + std::string(decimal_point - n, '0') + ".0";
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return sign + out;
}

namespace {

uint32_t decode_code_point(std::string_view cp) {
  auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(cp[i])); };
  if (cp.size() == 1) return byte(0);
  if (cp.size() == 2) return ((byte(0) & 0x1f) << 6) | (byte(1) & 0x3f);
  if (cp.size() == 3) return ((byte(0) & 0x0f) << 12) | ((byte(1) & 0x3f) << 6) | (byte(2) & 0x3f);
  return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3f) << 12) | ((byte(2) & 0x3f) << 6) |
         (byte(3) & 0x3f);
}

// Non-ASCII code points Python's repr() escapes (categories Cc, Cf, Zs, Zl, Zp, Co, Cs). Unassigned
// code points (Cn) are not listed: those print raw here where Python would escape them.
bool python_repr_escapes(uint32_t c) {
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x80, 0xa0},       {0xad, 0xad},        {0x600, 0x605},     {0x61c, 0x61c},
      {0x6dd, 0x6dd},     {0x70f, 0x70f},      {0x890, 0x891},     {0x8e2, 0x8e2},
      {0x1680, 0x1680},   {0x180e, 0x180e},    {0x2000, 0x200f},   {0x2028, 0x202f},
      {0x205f, 0x2064},   {0x2066, 0x206f},    {0x3000, 0x3000},   {0xd800, 0xf8ff},
      {0xfeff, 0xfeff},   {0xfff9, 0xfffb},    {0x110bd, 0x110bd}, {0x110cd, 0x110cd},
      {0x13430, 0x1343f}, {0x1bca0, 0x1bca3},  {0x1d173, 0x1d17a}, {0xe0001, 0xe0001},
      {0xe0020, 0xe007f}, {0xf0000, 0x10ffff},
  };
  for (const auto& [lo, hi] : kRanges)
    if (c >= lo && c <= hi) return true;
  return false;
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (std::string_view cp : code_points(s)) {
    uint32_t c = decode_code_point(cp);
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c >= 0x80 && python_repr_escapes(c)) {
      out += c <= 0xff     ? fmt::format("\\x{:02x}", c)
             : c <= 0xffff ? fmt::format("\\u{:04x}", c)
                           : fmt::format("\\U{:08x}", c);
    } else {
      out += cp;
    }
  }
  out += quote;
  return out;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::string_view cp : code_points(s)) {
    uint32_t c = decode_code_point(cp);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            uint32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", c);
          }
        } else {
          out += cp;
        }
    }
  }
  out += '"';
}

Status json_value(const Value& v, const JsonOptions& options, int depth, std::string& out) {
  if (depth > 512) return Status::error("tojson: value nested too deeply");
  auto newline = [&](int level) {
    if (options.indent < 0 && options.indent_text.empty()) return;
    out += '\n';
    for (int i = 0; i < level; ++i)
      out += options.indent_text.empty() ? std::string(options.indent, ' ') : options.indent_text;
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return Status::ok();
    case Kind::kBool:
      out += v.boolean ? "true" : "false";
      return Status::ok();
    case Kind::kInt:
      out += std::to_string(v.integer);
      return Status::ok();
    case Kind::kFloat:
      if (std::isnan(v.number))
        out += "NaN";
      else if (std::isinf(v.number))
        out += v.number > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.number);
      return Status::ok();
    case Kind::kString:
      json_string(v.text, options.ensure_ascii, out);
      return Status::ok();
    case Kind::kList:
    case Kind::kTuple: {
      if (v.flavor != ListFlavor::kPlain)
        return Status::error(
            "Object of type generator/view/range is not JSON serializable (add '| list')");
      if (v.list->empty()) {
        out += "[]";
        return Status::ok();
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += options.item_separator;
        newline(depth + 1);
        SY_TRY(json_value((*v.list)[i], options, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::ok();
    }
    case Kind::kDict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return Status::ok();
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.dict->entries) entries.push_back(&entry);
      if (options.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += options.item_separator;
        newline(depth + 1);
        json_string(entries[i]->first, options.ensure_ascii, out);
        out += options.key_separator;
        SY_TRY(json_value(entries[i]->second, options, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::ok();
    }
    default:
      return Status::errorf("Object of type {} is not JSON serializable", type_name(v));
  }
}

Status repr_into(const Value& v, int depth, std::string& out) {
  if (depth > 512) return Status::error("value nested too deeply to print");
  switch (v.kind) {
    case Kind::kString:
      out += string_repr(v.text);
      return Status::ok();
    case Kind::kList:
    case Kind::kTuple: {
      if (v.flavor == ListFlavor::kGenerator)
        return Status::error(
            "printing a generator (the result of map/select/selectattr/reverse/unique/items) is "
            "not "
            "supported; add '| list'");
      if (v.flavor == ListFlavor::kRange) {
        out += v.text;
        return Status::ok();
      }
      const char* view = v.flavor == ListFlavor::kDictItems    ? "dict_items("
                         : v.flavor == ListFlavor::kDictKeys   ? "dict_keys("
                         : v.flavor == ListFlavor::kDictValues ? "dict_values("
                                                               : nullptr;
      if (view) {
        Value plain = v;
        plain.flavor = ListFlavor::kPlain;
        out += view;
        SY_TRY(repr_into(plain, depth, out));
        out += ')';
        return Status::ok();
      }
      bool tuple = v.kind == Kind::kTuple;
      out += tuple ? '(' : '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        SY_TRY(repr_into((*v.list)[i], depth + 1, out));
      }
      if (tuple && v.list->size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return Status::ok();
    }
    case Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(key);
        out += ": ";
        SY_TRY(repr_into(value, depth + 1, out));
      }
      out += '}';
      return Status::ok();
    }
    case Kind::kUndefined:
      out += "Undefined";
      return Status::ok();
    case Kind::kNamespace:
    case Kind::kCallable:
      return Status::errorf("printing a {} object is not supported", type_name(v));
    default: {
      SY_ASSIGN(std::string s, to_str(v));
      out += s;
      return Status::ok();
    }
  }
}

Result<Value> from_json_at(const nlohmann::ordered_json& json, int depth) {
  if (depth > 256) return Status::error("input JSON nested more than 256 levels deep");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::from_bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::from_int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        return Status::errorf("integer {} is too large (limit 2^63-1)", u);
      return Value::from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::from_float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::from_string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) {
        SY_ASSIGN(Value v, from_json_at(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      dict.entries.reserve(json.size());
      for (const auto& [key, item] : json.items()) {
        SY_ASSIGN(Value v, from_json_at(item, depth + 1));
        dict.entries.emplace_back(key, std::move(v));
      }
      return Value::from_dict(std::move(dict));
    }
    default:
      return Status::error("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

Result<std::string> to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return std::string();
    case Kind::kNone:
      return std::string("None");
    case Kind::kBool:
      return std::string(v.boolean ? "True" : "False");
    case Kind::kInt:
      return std::to_string(v.integer);
    case Kind::kFloat:
      return float_repr(v.number);
    case Kind::kString:
      return v.text;
    default: {
      std::string out;
      SY_TRY(repr_into(v, 0, out));
      return out;
    }
  }
}

Result<std::string> to_repr(const Value& v) {
  std::string out;
  SY_TRY(repr_into(v, 0, out));
  return out;
}

Result<std::string> to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  SY_TRY(json_value(v, options, 0, out));
  return out;
}

Result<Value> from_json(const nlohmann::ordered_json& json) {
  return from_json_at(json, 0);
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 1;
    if (i + len > s.size()) len = s.size() - i;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  return n;
}

bool is_python_space(std::string_view code_point) {
  uint32_t c = decode_code_point(code_point);
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace sy::chat
