// The values a chat template computes with, behaving as the Python objects jinja2 sees: str() and
// repr() print like Python, tojson like json.dumps, == and truthiness like Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace sy::chat {

struct Value;
class Renderer;
struct CallArgs;

using ValueList = std::vector<Value>;
using NativeFunction = std::function<Result<Value>(Renderer&, CallArgs&)>;

// Insertion-ordered str -> Value map (Python dicts keep insertion order; JSON objects arrive so).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value value);
};

struct Callable {
  std::string name;  // for messages: "range", "macro 'greet'", "str.split"
  NativeFunction call;
};

// What a kList value really is in Python: results of map/select/... are generators (always truthy,
// no len(), not printable), dict.items()/keys()/values() are views, range() is a range object.
enum class ListFlavor : uint8_t { kPlain, kGenerator, kDictItems, kDictKeys, kDictValues, kRange };

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable,
};

struct Value {
  Kind kind = Kind::kUndefined;
  ListFlavor flavor = ListFlavor::kPlain;  // kList only
  bool markup =
      false;  // kString produced by |safe: jinja2 Markup, whose arithmetic escapes operands
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string
      text;  // kString; kUndefined: why it is undefined ("'x' is undefined"); kRange: its repr
  std::shared_ptr<const ValueList> list;  // kList, kTuple
  std::shared_ptr<Dict> dict;             // kDict (never mutated after creation), kNamespace
  std::shared_ptr<const Callable> function;

  static Value undefined(std::string why) {
    Value v;
    v.text = std::move(why);
    return v;
  }
  static Value none() { return make(Kind::kNone); }
  static Value from_bool(bool b) {
    Value v = make(Kind::kBool);
    v.boolean = b;
    return v;
  }
  static Value from_int(int64_t i) {
    Value v = make(Kind::kInt);
    v.integer = i;
    return v;
  }
  static Value from_float(double d) {
    Value v = make(Kind::kFloat);
    v.number = d;
    return v;
  }
  static Value from_string(std::string s) {
    Value v = make(Kind::kString);
    v.text = std::move(s);
    return v;
  }
  static Value from_list(ValueList items, bool tuple = false) {
    Value v = make(tuple ? Kind::kTuple : Kind::kList);
    v.list = std::make_shared<const ValueList>(std::move(items));
    return v;
  }
  static Value from_dict(Dict d) {
    Value v = make(Kind::kDict);
    v.dict = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value from_function(std::string name, NativeFunction fn) {
    Value v = make(Kind::kCallable);
    v.function = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict; }
  // int, float or bool (Python's numbers.Number includes bool).
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_integral() const { return kind == Kind::kInt || kind == Kind::kBool; }
  int64_t as_int() const { return kind == Kind::kBool ? (boolean ? 1 : 0) : integer; }
  double as_double() const { return kind == Kind::kFloat ? number : static_cast<double>(as_int()); }
};

// Python type name, as in error messages ("str", "int", "NoneType", "dict", "Undefined").
const char* type_name(const Value& v);
bool truthy(const Value& v);
// Python ==, including 1 == 1.0 == True and Undefined == Undefined.
bool equal(const Value& a, const Value& b);
// Python <; error for unorderable types ("'<' not supported between instances of 'str' and 'int'").
Result<bool> less(const Value& a, const Value& b);

// str(v) as jinja2 prints it ({{ v }}): Undefined prints "", None "None", floats as Python repr.
Result<std::string> to_str(const Value& v);
// repr(v) as Python: lists/dicts/tuples print their items' repr.
Result<std::string> to_repr(const Value& v);
// Python repr of a float (shortest round-trip, "1e+20", "2.0", "inf").
std::string float_repr(double d);

struct JsonOptions {
  int indent = -1;          // <0: no newlines (json.dumps(indent=None))
  std::string indent_text;  // when indent given as a string
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
};
// json.dumps(v, ...) as transformers' tojson calls it.
Result<std::string> to_json(const Value& v, const JsonOptions& options);

// JSON input (messages, tools, kwargs) to values, keeping key order; depth-capped.
Result<Value> from_json(const nlohmann::ordered_json& json);

// UTF-8 helpers: templates index and measure strings by code point, as Python does.
std::vector<std::string_view> code_points(std::string_view s);
size_t code_point_count(std::string_view s);
// Python str.isspace() for one code point given as UTF-8.
bool is_python_space(std::string_view code_point);

}  // namespace sy::chat
