#include "chat/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <set>

namespace sy::chat {
namespace {

// ---- small helpers ----

Status undefined_error(const Value& v) {
  return Status::error(v.text.empty() ? "value is undefined" : v.text);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

Status require_ascii(std::string_view s, const char* operation) {
  if (is_ascii(s)) return Status::ok();
  return Status::errorf("{} of non-ASCII text is not supported (Unicode case mapping)", operation);
}

char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
char ascii_upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
bool ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string lower(std::string s) {
  for (char& c : s) c = ascii_lower(c);
  return s;
}
std::string upper(std::string s) {
  for (char& c : s) c = ascii_upper(c);
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}
// Python str.title(): a letter after a letter is lowered, any other letter is uppered.
std::string python_title(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    if (ascii_alpha(c)) {
      c = previous_cased ? ascii_lower(c) : ascii_upper(c);
      previous_cased = true;
    } else {
      previous_cased = false;
    }
  }
  return out;
}

Result<const std::string*> string_arg(const Value* v, const char* what) {
  if (!v || !v->is_string()) return Status::errorf("{} must be a string", what);
  return &v->text;
}

Result<int64_t> int_arg(const Value* v, const char* what, int64_t fallback) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_integral())
    return Status::errorf("{} must be an integer, got {}", what, type_name(*v));
  return v->as_int();
}

bool bool_arg(const Value* v, bool fallback) {
  return v ? truthy(*v) : fallback;
}

Value generator(ValueList items) {
  Value v = Value::from_list(std::move(items));
  v.flavor = ListFlavor::kGenerator;
  return v;
}

Value view(ValueList items, ListFlavor flavor) {
  Value v = Value::from_list(std::move(items));
  v.flavor = flavor;
  return v;
}

// Python whitespace / explicit-characters strip on code points.
std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right) {
  auto points = code_points(s);
  std::vector<std::string_view> set;
  if (chars)
    for (std::string_view cp : code_points(*chars)) set.push_back(cp);
  auto strip_this = [&](std::string_view cp) {
    if (!chars) return is_python_space(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = points.size();
  if (left)
    while (begin < end && strip_this(points[begin])) ++begin;
  if (right)
    while (end > begin && strip_this(points[end - 1])) --end;
  if (begin == end) return std::string();
  const char* first = points[begin].data();
  const char* last = points[end - 1].data() + points[end - 1].size();
  return std::string(first, last);
}

Result<std::string> strip_with(const Value* chars_value, const std::string& s, bool left,
                               bool right) {
  if (chars_value && !chars_value->is_none()) {
    if (!chars_value->is_string()) return Status::error("strip arg must be None or str");
    return strip_chars(s, &chars_value->text, left, right);
  }
  return strip_chars(s, nullptr, left, right);
}

Result<ValueList> split_string(const std::string& s, const Value* sep_value, int64_t max_split,
                               bool from_right) {
  ValueList parts;
  if (sep_value && !sep_value->is_none()) {
    if (!sep_value->is_string()) return Status::error("split separator must be str or None");
    const std::string& sep = sep_value->text;
    if (sep.empty()) return Status::error("empty separator");
    if (!from_right) {
      size_t start = 0;
      int64_t splits = 0;
      while (max_split < 0 || splits < max_split) {
        size_t at = s.find(sep, start);
        if (at == std::string::npos) break;
        parts.push_back(Value::from_string(s.substr(start, at - start)));
        start = at + sep.size();
        ++splits;
      }
      parts.push_back(Value::from_string(s.substr(start)));
    } else {
      size_t end = s.size();
      int64_t splits = 0;
      std::vector<std::string> reversed;
      while (max_split < 0 || splits < max_split) {
        if (end < sep.size()) break;
        size_t at = s.rfind(sep, end - sep.size());
        if (at == std::string::npos) break;
        reversed.push_back(s.substr(at + sep.size(), end - at - sep.size()));
        end = at;
        ++splits;
      }
      reversed.push_back(s.substr(0, end));
      for (auto it = reversed.rbegin(); it != reversed.rend(); ++it)
        parts.push_back(Value::from_string(*it));
    }
    return parts;
  }
  // Whitespace split: runs of Python whitespace separate, empty strings dropped.
  auto points = code_points(s);
  std::vector<std::pair<size_t, size_t>> words;  // code point ranges
  size_t i = 0;
  const size_t n = points.size();
  auto text_of = [&](size_t a, size_t b) {
    if (a >= b) return std::string();
    return std::string(points[a].data(), points[b - 1].data() + points[b - 1].size());
  };
  if (!from_right) {
    int64_t splits = 0;
    while (true) {
      while (i < n && is_python_space(points[i])) ++i;
      if (i >= n) break;
      if (max_split >= 0 && splits >= max_split) {
        size_t end = n;
        parts.push_back(Value::from_string(text_of(i, end)));
        break;
      }
      size_t start = i;
      while (i < n && !is_python_space(points[i])) ++i;
      parts.push_back(Value::from_string(text_of(start, i)));
      ++splits;
    }
  } else {
    size_t end = n;
    int64_t splits = 0;
    std::vector<std::string> reversed;
    while (true) {
      while (end > 0 && is_python_space(points[end - 1])) --end;
      if (end == 0) break;
      if (max_split >= 0 && splits >= max_split) {
        reversed.push_back(text_of(0, end));
        break;
      }
      size_t stop = end;
      while (end > 0 && !is_python_space(points[end - 1])) --end;
      reversed.push_back(text_of(end, stop));
      ++splits;
    }
    for (auto it = reversed.rbegin(); it != reversed.rend(); ++it)
      parts.push_back(Value::from_string(*it));
  }
  return parts;
}

bool is_line_break(std::string_view cp) {
  static const char* kBreaks[] = {"\n",   "\r",   "\v",       "\f",           "\x1c",
                                  "\x1d", "\x1e", "\xc2\x85", "\xe2\x80\xa8", "\xe2\x80\xa9"};
  for (const char* b : kBreaks)
    if (cp == b) return true;
  return false;
}

// Python str.splitlines() (keepends=False).
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  auto points = code_points(s);
  std::string current;
  for (size_t i = 0; i < points.size(); ++i) {
    if (is_line_break(points[i])) {
      lines.push_back(current);
      current.clear();
      if (points[i] == "\r" && i + 1 < points.size() && points[i + 1] == "\n") ++i;
    } else {
      current += points[i];
    }
  }
  if (!current.empty()) lines.push_back(current);
  return lines;
}

std::string replace_all(const std::string& s, const std::string& old_text,
                        const std::string& new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    auto points = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= points.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (i < points.size()) out += points[i];
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old_text, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += new_text;
    start = at + old_text.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// jinja2's make_attrgetter: "a.b.0" looked up item by item (digits become integer indices).
Result<Value> attribute_path(Renderer& r, const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Value key = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)
                    ? Value::from_int(std::stoll(part))
                    : Value::from_string(part);
    SY_ASSIGN(current, r.get_item(current, key));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Result<Value> attribute_or_item(Renderer& r, const Value& item, const Value* attribute) {
  if (!attribute || attribute->is_none()) return item;
  if (attribute->is_integral()) return r.get_item(item, *attribute);
  if (!attribute->is_string()) return Status::error("attribute must be a string or an integer");
  return attribute_path(r, item, attribute->text);
}

// Key for case-insensitive sorting / comparison (jinja2's ignore_case: lowercases strings).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::from_string(lower(v.text));
  return v;
}

Status check_sortable_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return require_ascii(v.text, "case-insensitive sorting");
  return Status::ok();
}

// Items of `value` through `iterate`, charging the work.
Result<ValueList> items_of(Renderer& r, const Value& value) {
  SY_ASSIGN(ValueList items, r.iterate(value));
  SY_TRY(r.charge_iterations(items.size()));
  return items;
}

Result<Value> python_int(const Value& v, const Value* default_value, int64_t base) {
  Value fallback = default_value ? *default_value : Value::from_int(0);
  switch (v.kind) {
    case Kind::kInt:
    case Kind::kBool:
      return Value::from_int(v.as_int());
    case Kind::kFloat:
      if (!std::isfinite(v.number) || std::fabs(v.number) >= 9.2e18) return fallback;
      return Value::from_int(static_cast<int64_t>(v.number));
    case Kind::kString: {
      std::string s = strip_chars(v.text, nullptr, true, true);
      std::string digits;
      for (char c : s)
        if (c != '_') digits += c;
      if (!digits.empty() && is_ascii(digits)) {
        int effective = static_cast<int>(base);
        size_t offset = 0;
        bool negative = false;
        if (digits[0] == '+' || digits[0] == '-') {
          negative = digits[0] == '-';
          offset = 1;
        }
        std::string body = digits.substr(offset);
        auto prefixed = [&](char p) {
          return body.size() > 2 && body[0] == '0' && ascii_lower(body[1]) == p;
        };
        if ((effective == 16 || effective == 0) && prefixed('x')) {
          body = body.substr(2);
          effective = 16;
        } else if ((effective == 8 || effective == 0) && prefixed('o')) {
          body = body.substr(2);
          effective = 8;
        } else if ((effective == 2 || effective == 0) && prefixed('b')) {
          body = body.substr(2);
          effective = 2;
        } else if (effective == 0) {
          effective = 10;
        }
        if (!body.empty() && effective >= 2 && effective <= 36) {
          errno = 0;
          char* end = nullptr;
          long long parsed = std::strtoll(body.c_str(), &end, effective);
          if (errno == 0 && end && *end == '\0' && body[0] != '-' && body[0] != '+')
            return Value::from_int(negative ? -parsed : parsed);
        }
      }
      // jinja2 then tries int(float(value)).
      char* end = nullptr;
      std::string plain = s;
      double d = std::strtod(plain.c_str(), &end);
      if (!plain.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18 &&
          plain.find_first_of("xXpP") == std::string::npos)
        return Value::from_int(static_cast<int64_t>(d));
      return fallback;
    }
    default:
      return fallback;
  }
}

Result<Value> python_float(const Value& v, const Value* default_value) {
  Value fallback = default_value ? *default_value : Value::from_float(0.0);
  if (v.is_number()) return Value::from_float(v.as_double());
  if (v.is_string()) {
    std::string s;
    for (char c : strip_chars(v.text, nullptr, true, true))
      if (c != '_') s += c;
    std::string low = lower(s);
    if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity")
      return Value::from_float(INFINITY);
    if (low == "-inf" || low == "-infinity") return Value::from_float(-INFINITY);
    if (low == "nan" || low == "+nan" || low == "-nan") return Value::from_float(NAN);
    if (!s.empty() && s.find_first_of("xXpP") == std::string::npos) {
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (end && *end == '\0') return Value::from_float(d);
    }
  }
  return fallback;
}

// Python round(x, ndigits) for floats: correctly rounded, ties to even (glibc printf is exact).
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits < -300) return 0.0 * x;
  if (digits >= 0) {
    std::string text = fmt::format("{:.{}f}", x, static_cast<int>(digits));
    return std::strtod(text.c_str(), nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-digits));
  double y = x / scale;
  double r = std::nearbyint(y);
  return r * scale;
}

// ---- tests ----

Result<bool> run_test(Renderer& r, const std::string& name, const Value& v, CallArgs& args) {
  const Value* arg = args.get(0, nullptr);
  auto need_arg = [&]() -> Status {
    if (!arg) return Status::errorf("test '{}' needs an argument", name);
    return Status::ok();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.boolean;
  if (name == "false") return v.kind == Kind::kBool && !v.boolean;
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind == Kind::kDict;
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping();
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || v.kind == Kind::kTuple || v.is_mapping() ||
           (v.kind == Kind::kList && v.flavor != ListFlavor::kGenerator);
  if (name == "callable") return v.kind == Kind::kCallable;
  if (name == "escaped") return v.markup;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) {
      SY_ASSIGN(std::string s, to_str(v));
      Value as_string = Value::from_string(s);
      return run_test(r, name, as_string, args);
    }
    SY_TRY(require_ascii(v.text, "is lower/upper"));
    bool any_cased = false;
    for (char c : v.text) {
      if (ascii_alpha(c)) {
        any_cased = true;
        if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
      }
    }
    return any_cased;
  }
  if (name == "odd" || name == "even") {
    if (v.is_undefined()) return undefined_error(v);
    if (!v.is_integral()) return Status::errorf("'{}' is not an integer", type_name(v));
    int64_t m = v.as_int() % 2;
    return (m != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    SY_TRY(need_arg());
    if (!v.is_integral() || !arg->is_integral()) return Status::error("divisibleby needs integers");
    if (arg->as_int() == 0) return Status::error("integer division or modulo by zero");
    return v.as_int() % arg->as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") {
    SY_TRY(need_arg());
    return equal(v, *arg);
  }
  if (name == "ne" || name == "!=") {
    SY_TRY(need_arg());
    return !equal(v, *arg);
  }
  if (name == "sameas") {
    SY_TRY(need_arg());
    // `is` identity: singletons and small ints behave as in CPython; containers are never the same
    // here.
    if (v.kind != arg->kind) return false;
    if (v.is_none() || v.is_undefined()) return v.kind == Kind::kNone;
    if (v.kind == Kind::kBool) return v.boolean == arg->boolean;
    if (v.kind == Kind::kInt)
      return v.integer == arg->integer && v.integer >= -5 && v.integer <= 256;
    if (v.is_sequence() || v.is_mapping() || v.kind == Kind::kNamespace)
      return v.list == arg->list && v.dict == arg->dict;
    return Status::error(
        "'sameas' on strings and floats depends on CPython's object identity; not supported");
  }
  if (name == "lt" || name == "lessthan" || name == "<" || name == "gt" || name == "greaterthan" ||
      name == ">" || name == "le" || name == "<=" || name == "ge" || name == ">=") {
    SY_TRY(need_arg());
    if (v.is_undefined()) return undefined_error(v);
    bool comparable = (v.is_number() && arg->is_number()) || (v.is_string() && arg->is_string()) ||
                      (v.is_sequence() && v.kind == arg->kind);
    if (!comparable)
      return Status::errorf("comparison not supported between '{}' and '{}'", type_name(v),
                            type_name(*arg));
    if (name == "lt" || name == "lessthan" || name == "<") return less(v, *arg);
    if (name == "gt" || name == "greaterthan" || name == ">") return less(*arg, v);
    if (name == "le" || name == "<=") {
      SY_ASSIGN(bool greater, less(*arg, v));
      return !greater;
    }
    SY_ASSIGN(bool smaller, less(v, *arg));
    return !smaller;
  }
  if (name == "in") {
    SY_TRY(need_arg());
    switch (arg->kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (!v.is_string())
          return Status::errorf("'in <string>' requires string as left operand, not {}",
                                type_name(v));
        return arg->text.find(v.text) != std::string::npos;
      case Kind::kList:
      case Kind::kTuple:
        for (const Value& item : *arg->list)
          if (equal(item, v)) return true;
        return false;
      case Kind::kDict:
        return v.is_string() && arg->dict->find(v.text) != nullptr;
      default:
        return Status::errorf("argument of type '{}' is not iterable", type_name(*arg));
    }
  }
  return Status::errorf("no test named '{}'", name);
}

const char* const kTests[] = {
    "defined", "undefined", "none",    "boolean",     "true",     "false",    "integer", "float",
    "number",  "string",    "mapping", "iterable",    "sequence", "callable", "escaped", "lower",
    "upper",   "odd",       "even",    "divisibleby", "eq",       "equalto",  "ne",      "sameas",
    "lt",      "lessthan",  "gt",      "greaterthan", "le",       "ge",       "in",      "==",
    "!=",      "<",         "<=",      ">",           ">="};

// Consumes a select-style test name and its arguments from args[first...].
Result<bool> select_test(Renderer& r, CallArgs& args, size_t first, const Value& item) {
  const Value* test_name = args.get(first, nullptr);
  if (!test_name) return truthy(item);
  if (!test_name->is_string()) return Status::error("test name must be a string");
  CallArgs test_args;
  for (size_t i = first + 1; i < args.positional.size(); ++i) {
    args.get(i, nullptr);
    test_args.positional.push_back(args.positional[i]);
  }
  return run_test(r, test_name->text, item, test_args);
}

// ---- filters ----

Result<Value> filter_tojson(const Value& input, CallArgs& args) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  JsonOptions options;
  options.ensure_ascii = bool_arg(args.get(0, "ensure_ascii"), false);
  const Value* indent = args.get(1, "indent");
  const Value* separators = args.get(2, "separators");
  options.sort_keys = bool_arg(args.get(3, "sort_keys"), false);
  if (indent && !indent->is_none()) {
    if (indent->is_integral()) {
      options.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 1000));
    } else if (indent->is_string()) {
      options.indent = 0;
      options.indent_text = indent->text;
      if (indent->text.empty()) options.indent_text.clear();
    } else {
      return Status::error("indent must be an integer or a string");
    }
    options.item_separator = ",";
  }
  if (separators && !separators->is_none()) {
    if (!separators->is_sequence() || separators->list->size() != 2 ||
        !(*separators->list)[0].is_string() || !(*separators->list)[1].is_string())
      return Status::error("separators must be a pair of strings");
    options.item_separator = (*separators->list)[0].text;
    options.key_separator = (*separators->list)[1].text;
  }
  SY_TRY(args.check_all_used("tojson"));
  SY_ASSIGN(std::string text, to_json(input, options));
  return Value::from_string(std::move(text));
}

Result<Value> filter_map(Renderer& r, const Value& input, CallArgs& args) {
  SY_ASSIGN(ValueList items, items_of(r, input));
  ValueList out;
  const Value* attribute = nullptr;
  for (const auto& [key, value] : args.keyword)
    if (key == "attribute") attribute = &value;
  if (attribute || args.positional.empty()) {
    const Value* attr = args.get(99, "attribute");
    const Value* default_value = args.get(99, "default");
    SY_TRY(args.check_all_used("map"));
    if (!attr) return Status::error("map needs a filter name or attribute=");
    for (const Value& item : items) {
      SY_ASSIGN(Value v, attribute_or_item(r, item, attr));
      if (v.is_undefined() && default_value) v = *default_value;
      out.push_back(std::move(v));
    }
    return generator(std::move(out));
  }
  const Value* filter_name = args.get(0, nullptr);
  if (!filter_name->is_string()) return Status::error("map filter name must be a string");
  if (!is_known_filter(filter_name->text))
    return Status::errorf("unknown filter '{}'", filter_name->text);
  for (const Value& item : items) {
    CallArgs inner;
    for (size_t i = 1; i < args.positional.size(); ++i)
      inner.positional.push_back(args.positional[i]);
    inner.keyword = args.keyword;
    SY_ASSIGN(Value v, apply_filter(r, filter_name->text, item, inner));
    out.push_back(std::move(v));
  }
  for (size_t i = 1; i < args.positional.size(); ++i) args.get(i, nullptr);
  for (const auto& [key, value] : args.keyword) args.get(99, key.c_str());
  return generator(std::move(out));
}

Result<Value> filter_sort(Renderer& r, const Value& input, CallArgs& args) {
  bool reverse = bool_arg(args.get(0, "reverse"), false);
  bool case_sensitive = bool_arg(args.get(1, "case_sensitive"), false);
  const Value* attribute = args.get(2, "attribute");
  SY_TRY(args.check_all_used("sort"));
  SY_ASSIGN(ValueList items, items_of(r, input));
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    SY_ASSIGN(Value key, attribute_or_item(r, item, attribute));
    SY_TRY(check_sortable_case(key, case_sensitive));
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(item));
  }
  Status failure;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto lt = reverse ? less(b.first, a.first) : less(a.first, b.first);
    if (!lt) {
      failure = lt.status();
      return false;
    }
    return *lt;
  });
  SY_TRY(failure);
  ValueList out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::from_list(std::move(out));
}

Result<Value> filter_min_max(Renderer& r, const Value& input, CallArgs& args, bool want_max) {
  bool case_sensitive = bool_arg(args.get(0, "case_sensitive"), false);
  const Value* attribute = args.get(1, "attribute");
  SY_TRY(args.check_all_used(want_max ? "max" : "min"));
  SY_ASSIGN(ValueList items, items_of(r, input));
  if (items.empty())
    return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    SY_ASSIGN(Value key, attribute_or_item(r, items[i], attribute));
    SY_TRY(check_sortable_case(key, case_sensitive));
    key = sort_key(key, case_sensitive);
    if (i == 0) {
      best_key = key;
      continue;
    }
    SY_ASSIGN(bool better, want_max ? less(best_key, key) : less(key, best_key));
    if (better) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Result<Value> filter_indent(const Value& input, CallArgs& args) {
  const Value* width = args.get(0, "width");
  bool first = bool_arg(args.get(1, "first"), false);
  bool blank = bool_arg(args.get(2, "blank"), false);
  SY_TRY(args.check_all_used("indent"));
  std::string indentation;
  if (!width) {
    indentation = "    ";
  } else if (width->is_string()) {
    indentation = width->text;
  } else if (width->is_integral()) {
    indentation =
        std::string(static_cast<size_t>(std::clamp<int64_t>(width->as_int(), 0, 1000)), ' ');
  } else {
    return Status::error("indent width must be an integer or a string");
  }
  SY_ASSIGN(std::string s, to_str(input));
  s += "\n";
  std::vector<std::string> lines = split_lines(s);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i)
      out += (i ? "\n" + indentation : std::string()) + lines[i];
  } else if (!lines.empty()) {
    out = lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      out += "\n" + (lines[i].empty() ? std::string() : indentation + lines[i]);
  }
  if (first) out = indentation + out;
  return Value::from_string(std::move(out));
}

// jinja2's title filter: capitalises after runs of "-", whitespace, "(", "{", "[", "<".
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' ||
                     (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
    if (separator) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? ascii_upper(c) : ascii_lower(c);
      word_start = false;
    }
  }
  return out;
}

Result<Value> run_filter(Renderer& r, const std::string& name, const Value& input, CallArgs& args) {
  if (input.markup && name != "length" && name != "count" && name != "safe" && name != "e" &&
      name != "escape")
    return Status::error("filters on a Markup string (the result of |safe) are not supported");
  auto done = [&](Result<Value> v) -> Result<Value> {
    SY_TRY(args.check_all_used(name));
    return v;
  };
  if (name == "safe") {
    SY_ASSIGN(std::string s, to_str(input));
    Value v = Value::from_string(std::move(s));
    v.markup = true;
    return done(v);
  }
  if (name == "e" || name == "escape") {
    if (input.markup) return done(input);
    SY_ASSIGN(std::string s, to_str(input));
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    Value v = Value::from_string(std::move(out));
    v.markup = true;
    return done(v);
  }
  if (name == "trim") {
    const Value* chars = args.get(0, "chars");
    SY_ASSIGN(std::string s, to_str(input));
    SY_ASSIGN(std::string stripped, strip_with(chars, s, true, true));
    return done(Value::from_string(std::move(stripped)));
  }
  if (name == "length" || name == "count") {
    switch (input.kind) {
      case Kind::kUndefined:
        return done(Value::from_int(0));
      case Kind::kString:
        return done(Value::from_int(static_cast<int64_t>(code_point_count(input.text))));
      case Kind::kList:
        if (input.flavor == ListFlavor::kGenerator)
          return Status::error("object of type 'generator' has no len()");
        return done(Value::from_int(static_cast<int64_t>(input.list->size())));
      case Kind::kTuple:
        return done(Value::from_int(static_cast<int64_t>(input.list->size())));
      case Kind::kDict:
        return done(Value::from_int(static_cast<int64_t>(input.dict->entries.size())));
      default:
        return Status::errorf("object of type '{}' has no len()", type_name(input));
    }
  }
  if (name == "string") {
    SY_ASSIGN(std::string s, to_str(input));
    return done(Value::from_string(std::move(s)));
  }
  if (name == "tojson") return filter_tojson(input, args);
  if (name == "items") {
    if (input.is_undefined()) return done(generator({}));
    if (!input.is_mapping()) return Status::error("Can only get item pairs from a mapping.");
    ValueList out;
    for (const auto& [key, value] : input.dict->entries)
      out.push_back(Value::from_list({Value::from_string(key), value}, true));
    SY_TRY(r.charge_iterations(out.size()));
    return done(generator(std::move(out)));
  }
  if (name == "list") {
    SY_ASSIGN(ValueList items, items_of(r, input));
    return done(Value::from_list(std::move(items)));
  }
  if (name == "first") {
    SY_ASSIGN(ValueList items, items_of(r, input));
    if (items.empty()) return done(Value::undefined("No first item, sequence was empty."));
    return done(items.front());
  }
  if (name == "last") {
    if (input.kind == Kind::kList && input.flavor == ListFlavor::kGenerator)
      return Status::error("'generator' object is not reversible");
    SY_ASSIGN(ValueList items, items_of(r, input));
    if (items.empty()) return done(Value::undefined("No last item, sequence was empty."));
    return done(items.back());
  }
  if (name == "join") {
    const Value* separator = args.get(0, "d");
    const Value* attribute = args.get(1, "attribute");
    SY_ASSIGN(ValueList items, items_of(r, input));
    std::string sep;
    if (separator) {
      SY_ASSIGN(sep, to_str(*separator));
    }
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      SY_ASSIGN(Value item, attribute_or_item(r, items[i], attribute));
      if (item.markup) return Status::error("joining Markup strings is not supported");
      SY_ASSIGN(std::string s, to_str(item));
      if (i) out += sep;
      out += s;
      SY_TRY(r.check_string_size(out.size()));
    }
    return done(Value::from_string(std::move(out)));
  }
  if (name == "select" || name == "reject") {
    SY_ASSIGN(ValueList items, items_of(r, input));
    ValueList out;
    for (const Value& item : items) {
      SY_ASSIGN(bool pass, select_test(r, args, 0, item));
      if (pass == (name == "select")) out.push_back(item);
    }
    args.mark_all_used();
    return done(generator(std::move(out)));
  }
  if (name == "selectattr" || name == "rejectattr") {
    const Value* attribute = args.get(0, "attribute");
    if (!attribute) return Status::errorf("{} needs an attribute name", name);
    SY_ASSIGN(ValueList items, items_of(r, input));
    ValueList out;
    for (const Value& item : items) {
      SY_ASSIGN(Value field, attribute_or_item(r, item, attribute));
      SY_ASSIGN(bool pass, select_test(r, args, 1, field));
      if (pass == (name == "selectattr")) out.push_back(item);
    }
    args.mark_all_used();
    return done(generator(std::move(out)));
  }
  if (name == "map") return filter_map(r, input, args);
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    bool boolean = bool_arg(args.get(1, "boolean"), false);
    bool use_default = input.is_undefined() || (boolean && !truthy(input));
    if (!use_default) return done(input);
    return done(fallback ? *fallback : Value::from_string(""));
  }
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
    SY_ASSIGN(std::string s, to_str(input));
    SY_TRY(require_ascii(s, name.c_str()));
    std::string out = name == "lower"        ? lower(s)
                      : name == "upper"      ? upper(s)
                      : name == "capitalize" ? capitalize(s)
                                             : jinja_title(s);
    return done(Value::from_string(std::move(out)));
  }
  if (name == "replace") {
    const Value* old_value = args.get(0, "old");
    const Value* new_value = args.get(1, "new");
    if (!old_value || !new_value) return Status::error("replace needs old and new");
    SY_ASSIGN(int64_t count, int_arg(args.get(2, "count"), "count", -1));
    SY_ASSIGN(std::string s, to_str(input));
    SY_ASSIGN(std::string old_text, to_str(*old_value));
    SY_ASSIGN(std::string new_text, to_str(*new_value));
    std::string out = replace_all(s, old_text, new_text, count);
    SY_TRY(r.check_string_size(out.size()));
    return done(Value::from_string(std::move(out)));
  }
  if (name == "int") {
    const Value* fallback = args.get(0, "default");
    SY_ASSIGN(int64_t base, int_arg(args.get(1, "base"), "base", 10));
    if (base != 0 && (base < 2 || base > 36))
      return Status::error("int() base must be >= 2 and <= 36, or 0");
    return done(python_int(input, fallback, base));
  }
  if (name == "float") return done(python_float(input, args.get(0, "default")));
  if (name == "abs") {
    if (input.is_undefined()) return undefined_error(input);
    if (input.kind == Kind::kFloat) return done(Value::from_float(std::fabs(input.number)));
    if (input.is_integral()) {
      if (input.as_int() == INT64_MIN) return Status::error("integer overflow in abs");
      return done(Value::from_int(std::llabs(input.as_int())));
    }
    return Status::errorf("bad operand type for abs(): '{}'", type_name(input));
  }
  if (name == "round") {
    SY_ASSIGN(int64_t precision, int_arg(args.get(0, "precision"), "precision", 0));
    const Value* method_value = args.get(1, "method");
    std::string method = method_value && method_value->is_string() ? method_value->text : "common";
    if (method != "common" && method != "ceil" && method != "floor")
      return Status::error("method must be 'common', 'ceil' or 'floor'");
    if (!input.is_number())
      return Status::errorf("type {} doesn't define __round__", type_name(input));
    if (method == "common") {
      if (input.is_integral()) {
        if (precision >= 0) return done(Value::from_int(input.as_int()));
        return Status::error("round() of an integer to negative precision is not supported");
      }
      return done(Value::from_float(python_round(input.number, precision)));
    }
    double scale = std::pow(10.0, static_cast<double>(precision));
    double scaled = input.as_double() * scale;
    double rounded = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
    return done(Value::from_float(rounded / scale));
  }
  if (name == "reverse") {
    if (input.is_string()) {
      auto points = code_points(input.text);
      std::string out;
      for (auto it = points.rbegin(); it != points.rend(); ++it) out += *it;
      return done(Value::from_string(std::move(out)));
    }
    SY_ASSIGN(ValueList items, items_of(r, input));
    std::reverse(items.begin(), items.end());
    if (input.kind == Kind::kList && input.flavor == ListFlavor::kGenerator)
      return done(Value::from_list(std::move(items)));
    return done(generator(std::move(items)));  // reversed() is an iterator
  }
  if (name == "sort") return filter_sort(r, input, args);
  if (name == "dictsort") {
    bool case_sensitive = bool_arg(args.get(0, "case_sensitive"), false);
    const Value* by_value = args.get(1, "by");
    bool reverse = bool_arg(args.get(2, "reverse"), false);
    std::string by = by_value && by_value->is_string() ? by_value->text : "key";
    if (by != "key" && by != "value")
      return Status::error("You can only sort by either 'key' or 'value'");
    if (!input.is_mapping()) return Status::error("dictsort needs a mapping");
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& [key, value] : input.dict->entries) {
      Value k = by == "key" ? Value::from_string(key) : value;
      SY_TRY(check_sortable_case(k, case_sensitive));
      keyed.emplace_back(sort_key(k, case_sensitive),
                         Value::from_list({Value::from_string(key), value}, true));
    }
    Status failure;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      auto lt = reverse ? less(b.first, a.first) : less(a.first, b.first);
      if (!lt) {
        failure = lt.status();
        return false;
      }
      return *lt;
    });
    SY_TRY(failure);
    ValueList out;
    for (auto& [k, pair] : keyed) out.push_back(std::move(pair));
    return done(Value::from_list(std::move(out)));
  }
  if (name == "unique") {
    bool case_sensitive = bool_arg(args.get(0, "case_sensitive"), false);
    const Value* attribute = args.get(1, "attribute");
    SY_ASSIGN(ValueList items, items_of(r, input));
    ValueList out;
    std::vector<Value> seen;
    for (const Value& item : items) {
      SY_ASSIGN(Value key, attribute_or_item(r, item, attribute));
      SY_TRY(check_sortable_case(key, case_sensitive));
      key = sort_key(key, case_sensitive);
      if (key.is_sequence() && key.kind == Kind::kList)
        return Status::error("unhashable type: 'list'");
      if (key.is_mapping()) return Status::error("unhashable type: 'dict'");
      bool duplicate = false;
      for (const Value& s : seen)
        if (equal(s, key)) duplicate = true;
      if (duplicate) continue;
      SY_TRY(r.charge_iterations(seen.size()));
      seen.push_back(key);
      out.push_back(item);
    }
    return done(generator(std::move(out)));
  }
  if (name == "min" || name == "max") return filter_min_max(r, input, args, name == "max");
  if (name == "sum") {
    const Value* attribute = args.get(0, "attribute");
    const Value* start = args.get(1, "start");
    SY_ASSIGN(ValueList items, items_of(r, input));
    Value total = start ? *start : Value::from_int(0);
    for (const Value& item : items) {
      SY_ASSIGN(Value v, attribute_or_item(r, item, attribute));
      if (!v.is_number() || !total.is_number())
        return Status::errorf("unsupported operand type(s) for +: '{}' and '{}'", type_name(total),
                              type_name(v));
      if (total.is_integral() && v.is_integral()) {
        int64_t out;
        if (__builtin_add_overflow(total.as_int(), v.as_int(), &out))
          return Status::error("integer overflow in sum");
        total = Value::from_int(out);
      } else {
        total = Value::from_float(total.as_double() + v.as_double());
      }
    }
    return done(total);
  }
  if (name == "indent") return filter_indent(input, args);
  return Status::errorf("no filter named '{}'", name);
}

const char* const kFilters[] = {
    "e",       "escape", "abs",    "capitalize", "count",      "d",      "default",    "dictsort",
    "first",   "float",  "indent", "int",        "items",      "join",   "last",       "length",
    "list",    "lower",  "map",    "max",        "min",        "reject", "rejectattr", "replace",
    "reverse", "round",  "safe",   "select",     "selectattr", "sort",   "string",     "sum",
    "title",   "tojson", "trim",   "unique",     "upper"};

// ---- methods ----

Value bound(const std::string& type, const std::string& name, NativeFunction fn) {
  return Value::from_function(type + "." + name, std::move(fn));
}

std::optional<Value> string_method(const Value& self, const std::string& name) {
  const std::string s = self.text;
  auto method = [&](NativeFunction fn) { return bound("str", name, std::move(fn)); };
  if (self.markup) {
    return method([name](Renderer&, CallArgs&) -> Result<Value> {
      return Status::errorf("str.{} on a Markup string (the result of |safe) is not supported",
                            name);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return method([s, name](Renderer&, CallArgs& args) -> Result<Value> {
      const Value* chars = args.get(0, nullptr);
      SY_TRY(args.check_all_used("str." + name));
      SY_ASSIGN(std::string out, strip_with(chars, s, name != "rstrip", name != "lstrip"));
      return Value::from_string(std::move(out));
    });
  }
  if (name == "split" || name == "rsplit") {
    return method([s, name](Renderer& r, CallArgs& args) -> Result<Value> {
      const Value* sep = args.get(0, "sep");
      SY_ASSIGN(int64_t max_split, int_arg(args.get(1, "maxsplit"), "maxsplit", -1));
      SY_TRY(args.check_all_used("str." + name));
      SY_ASSIGN(ValueList parts, split_string(s, sep, max_split, name == "rsplit"));
      SY_TRY(r.check_list_size(parts.size()));
      return Value::from_list(std::move(parts));
    });
  }
  if (name == "splitlines") {
    return method([s](Renderer&, CallArgs& args) -> Result<Value> {
      SY_TRY(args.check_all_used("str.splitlines"));
      ValueList out;
      for (auto& line : split_lines(s)) out.push_back(Value::from_string(std::move(line)));
      return Value::from_list(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return method([s, name](Renderer&, CallArgs& args) -> Result<Value> {
      const Value* affix = args.get(0, nullptr);
      SY_TRY(args.check_all_used("str." + name + " (start/end arguments are not supported)"));
      if (!affix) return Status::errorf("str.{} needs an argument", name);
      std::vector<std::string> options;
      if (affix->is_string()) {
        options.push_back(affix->text);
      } else if (affix->kind == Kind::kTuple) {
        for (const Value& v : *affix->list) {
          if (!v.is_string()) return Status::errorf("str.{}: tuple items must be str", name);
          options.push_back(v.text);
        }
      } else {
        return Status::errorf("{} first arg must be str or a tuple of str, not {}", name,
                              type_name(*affix));
      }
      for (const auto& o : options) {
        bool hit = name == "startswith"
                       ? s.compare(0, o.size(), o) == 0
                       : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
        if (hit) return Value::from_bool(true);
      }
      return Value::from_bool(false);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return method([s, name](Renderer&, CallArgs& args) -> Result<Value> {
      SY_TRY(args.check_all_used("str." + name));
      SY_TRY(require_ascii(s, ("str." + name).c_str()));
      return Value::from_string(name == "upper"   ? upper(s)
                                : name == "lower" ? lower(s)
                                : name == "title" ? python_title(s)
                                                  : capitalize(s));
    });
  }
  if (name == "replace") {
    return method([s](Renderer& r, CallArgs& args) -> Result<Value> {
      SY_ASSIGN(const std::string* old_text, string_arg(args.get(0, nullptr), "replace() old"));
      SY_ASSIGN(const std::string* new_text, string_arg(args.get(1, nullptr), "replace() new"));
      SY_ASSIGN(int64_t count, int_arg(args.get(2, "count"), "count", -1));
      SY_TRY(args.check_all_used("str.replace"));
      std::string out = replace_all(s, *old_text, *new_text, count);
      SY_TRY(r.check_string_size(out.size()));
      return Value::from_string(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return method([s, name](Renderer&, CallArgs& args) -> Result<Value> {
      SY_ASSIGN(const std::string* sub,
                string_arg(args.get(0, nullptr), ("str." + name + "() argument").c_str()));
      SY_TRY(args.check_all_used("str." + name + " (start/end arguments are not supported)"));
      if (name == "count") {
        if (sub->empty()) return Value::from_int(static_cast<int64_t>(code_point_count(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size()))
          ++n;
        return Value::from_int(n);
      }
      size_t at = name == "find" ? s.find(*sub) : s.rfind(*sub);
      if (at == std::string::npos) return Value::from_int(-1);
      return Value::from_int(
          static_cast<int64_t>(code_point_count(std::string_view(s).substr(0, at))));
    });
  }
  if (name == "join") {
    return method([s](Renderer& r, CallArgs& args) -> Result<Value> {
      const Value* iterable = args.get(0, nullptr);
      SY_TRY(args.check_all_used("str.join"));
      if (!iterable) return Status::error("str.join() takes exactly one argument");
      SY_ASSIGN(ValueList items, items_of(r, *iterable));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string())
          return Status::errorf("sequence item {}: expected str instance, {} found", i,
                                type_name(items[i]));
        if (i) out += s;
        out += items[i].text;
        SY_TRY(r.check_string_size(out.size()));
      }
      return Value::from_string(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    return method([s, name](Renderer&, CallArgs& args) -> Result<Value> {
      SY_TRY(args.check_all_used("str." + name));
      if (s.empty()) return Value::from_bool(false);
      if (name == "isspace") {
        for (std::string_view cp : code_points(s))
          if (!is_python_space(cp)) return Value::from_bool(false);
        return Value::from_bool(true);
      }
      SY_TRY(require_ascii(s, ("str." + name).c_str()));
      bool any_cased = false;
      for (char c : s) {
        bool digit = c >= '0' && c <= '9';
        if (name == "isdigit" && !digit) return Value::from_bool(false);
        if (name == "isalpha" && !ascii_alpha(c)) return Value::from_bool(false);
        if (name == "isalnum" && !ascii_alpha(c) && !digit) return Value::from_bool(false);
        if (ascii_alpha(c)) {
          any_cased = true;
          if (name == "islower" && c >= 'A' && c <= 'Z') return Value::from_bool(false);
          if (name == "isupper" && c >= 'a' && c <= 'z') return Value::from_bool(false);
        }
      }
      if (name == "islower" || name == "isupper") return Value::from_bool(any_cased);
      return Value::from_bool(true);
    });
  }
  static const char* kUnsupported[] = {
      "format",       "format_map",  "encode",    "center",     "ljust",        "rjust",
      "zfill",        "expandtabs",  "partition", "rpartition", "index",        "rindex",
      "casefold",     "swapcase",    "translate", "maketrans",  "isnumeric",    "isdecimal",
      "isidentifier", "isprintable", "istitle",   "isascii",    "removeprefix", "removesuffix"};
  for (const char* u : kUnsupported) {
    if (name == u) {
      return method([name](Renderer&, CallArgs&) -> Result<Value> {
        return Status::errorf("str.{}() is not supported", name);
      });
    }
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  std::shared_ptr<Dict> dict = self.dict;
  if (name == "items" || name == "keys" || name == "values") {
    return bound("dict", name, [dict, name](Renderer& r, CallArgs& args) -> Result<Value> {
      SY_TRY(args.check_all_used("dict." + name));
      ValueList out;
      for (const auto& [key, value] : dict->entries) {
        if (name == "items")
          out.push_back(Value::from_list({Value::from_string(key), value}, true));
        else if (name == "keys")
          out.push_back(Value::from_string(key));
        else
          out.push_back(value);
      }
      SY_TRY(r.charge_iterations(out.size()));
      return view(std::move(out), name == "items"  ? ListFlavor::kDictItems
                                  : name == "keys" ? ListFlavor::kDictKeys
                                                   : ListFlavor::kDictValues);
    });
  }
  if (name == "get") {
    return bound("dict", name, [dict](Renderer&, CallArgs& args) -> Result<Value> {
      const Value* key = args.get(0, nullptr);
      const Value* fallback = args.get(1, nullptr);
      SY_TRY(args.check_all_used("dict.get"));
      if (!key) return Status::error("dict.get expected at least 1 argument");
      if (key->is_string())
        if (const Value* v = dict->find(key->text)) return *v;
      return fallback ? *fallback : Value::none();
    });
  }
  if (name == "copy") {
    return bound("dict", name, [dict](Renderer&, CallArgs& args) -> Result<Value> {
      SY_TRY(args.check_all_used("dict.copy"));
      return Value::from_dict(*dict);
    });
  }
  static const char* kMutating[] = {"pop", "popitem", "setdefault", "update", "clear", "fromkeys"};
  for (const char* m : kMutating) {
    if (name == m) {
      return bound("dict", name, [name](Renderer&, CallArgs&) -> Result<Value> {
        return Status::errorf("access to attribute '{}' of 'dict' object is unsafe (sandboxed)",
                              name);
      });
    }
  }
  return std::nullopt;
}

std::optional<Value> list_method(const Value& self, const std::string& name) {
  auto items = self.list;
  if (self.kind == Kind::kList && self.flavor != ListFlavor::kPlain) return std::nullopt;
  if (name == "count" || name == "index") {
    return bound(type_name(self), name, [items, name](Renderer&, CallArgs& args) -> Result<Value> {
      const Value* needle = args.get(0, nullptr);
      SY_TRY(args.check_all_used(name));
      if (!needle) return Status::errorf("{}() takes exactly one argument", name);
      int64_t n = 0;
      for (size_t i = 0; i < items->size(); ++i) {
        if (!equal((*items)[i], *needle)) continue;
        if (name == "index") return Value::from_int(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return Status::error("x not in list");
      return Value::from_int(n);
    });
  }
  static const char* kMutating[] = {"append", "extend",  "insert", "pop",
                                    "remove", "reverse", "sort",   "clear"};
  if (self.kind == Kind::kList) {
    for (const char* m : kMutating) {
      if (name == m) {
        return bound("list", name, [name](Renderer&, CallArgs&) -> Result<Value> {
          return Status::errorf("access to attribute '{}' of 'list' object is unsafe (sandboxed)",
                                name);
        });
      }
    }
  }
  return std::nullopt;
}

}  // namespace

bool is_known_filter(std::string_view name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

bool is_known_test(std::string_view name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

Result<Value> apply_filter(Renderer& renderer, const std::string& name, const Value& input,
                           CallArgs& args) {
  return run_filter(renderer, name, input, args);
}

Result<bool> apply_test(Renderer& renderer, const std::string& name, const Value& value,
                        CallArgs& args) {
  SY_ASSIGN(bool passed, run_test(renderer, name, value, args));
  SY_TRY(args.check_all_used("test '" + name + "'"));
  return passed;
}

std::optional<Value> find_method(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Kind::kString:
      return string_method(object, name);
    case Kind::kDict:
      return dict_method(object, name);
    case Kind::kList:
    case Kind::kTuple:
      return list_method(object, name);
    default:
      return std::nullopt;
  }
}

void add_globals(Scope& scope) {
  scope.vars["range"] =
      Value::from_function("range", [](Renderer& r, CallArgs& args) -> Result<Value> {
        if (!args.keyword.empty()) return Status::error("range() takes no keyword arguments");
        if (args.positional.empty() || args.positional.size() > 3)
          return Status::errorf("range expected 1 to 3 arguments, got {}", args.positional.size());
        for (const Value& v : args.positional)
          if (!v.is_integral())
            return Status::errorf("'{}' object cannot be interpreted as an integer", type_name(v));
        int64_t start = 0, stop = 0, step = 1;
        if (args.positional.size() == 1) {
          stop = args.positional[0].as_int();
        } else {
          start = args.positional[0].as_int();
          stop = args.positional[1].as_int();
          if (args.positional.size() == 3) step = args.positional[2].as_int();
        }
        if (step == 0) return Status::error("range() arg 3 must not be zero");
        // jinja2's sandbox refuses ranges over MAX_RANGE (100000) items.
        long double span = step > 0 ? (static_cast<long double>(stop) - start)
                                    : (static_cast<long double>(start) - stop);
        long double count_ld = span <= 0 ? 0 : std::ceil(span / std::llabs(step));
        if (count_ld > 100000)
          return Status::error(
              "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        SY_TRY(r.charge_iterations(static_cast<size_t>(count_ld)));
        ValueList items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
          items.push_back(Value::from_int(i));
        Value v = Value::from_list(std::move(items));
        v.flavor = ListFlavor::kRange;
        v.text = step == 1 ? fmt::format("range({}, {})", start, stop)
                           : fmt::format("range({}, {}, {})", start, stop, step);
        return v;
      });
  scope.vars["namespace"] =
      Value::from_function("namespace", [](Renderer&, CallArgs& args) -> Result<Value> {
        Value ns = Value::make(Kind::kNamespace);
        ns.dict = std::make_shared<Dict>();
        if (args.positional.size() > 1)
          return Status::error("namespace() takes at most one positional argument");
        if (!args.positional.empty()) {
          const Value& init = args.positional[0];
          if (!init.is_mapping())
            return Status::error("namespace() positional argument must be a dict");
          ns.dict->entries = init.dict->entries;
        }
        for (auto& [key, value] : args.keyword) ns.dict->set(key, value);
        return ns;
      });
  scope.vars["dict"] = Value::from_function("dict", [](Renderer&, CallArgs& args) -> Result<Value> {
    Dict d;
    if (args.positional.size() > 1)
      return Status::error("dict() takes at most one positional argument");
    if (!args.positional.empty()) {
      if (!args.positional[0].is_mapping())
        return Status::error("dict() positional argument must be a dict");
      d.entries = args.positional[0].dict->entries;
    }
    for (auto& [key, value] : args.keyword) d.set(key, value);
    return Value::from_dict(std::move(d));
  });
  scope.vars["raise_exception"] =
      Value::from_function("raise_exception", [](Renderer&, CallArgs& args) -> Result<Value> {
        std::string message;
        if (!args.positional.empty()) {
          SY_ASSIGN(message, to_str(args.positional[0]));
        }
        return Status::errorf("the chat template raised an error: {}", message);
      });
  scope.vars["strftime_now"] =
      Value::from_function("strftime_now", [](Renderer& r, CallArgs& args) -> Result<Value> {
        const Value* format = args.get(0, "format");
        SY_TRY(args.check_all_used("strftime_now"));
        if (!format || !format->is_string())
          return Status::error("strftime_now needs a format string");
        for (const char* unsupported : {"%f", "%z", "%Z", "%:z"})
          if (format->text.find(unsupported) != std::string::npos)
            return Status::errorf("strftime_now: '{}' is not supported", unsupported);
        std::tm now = r.now();
        char buffer[512];
        size_t n = std::strftime(buffer, sizeof buffer, format->text.c_str(), &now);
        if (n == 0 && !format->text.empty())
          return Status::error("strftime_now: format too long or empty result");
        return Value::from_string(std::string(buffer, n));
      });
}

}  // namespace sy::chat
