#include "chat/renderer.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "chat/builtins.h"

namespace sy::chat {

const Value* CallArgs::get(size_t index, const char* name) {
  used_positional_.resize(positional.size());
  used_keyword_.resize(keyword.size());
  if (index < positional.size()) {
    used_positional_[index] = true;
    return &positional[index];
  }
  for (size_t i = 0; i < keyword.size(); ++i) {
    if (name && keyword[i].first == name) {
      used_keyword_[i] = true;
      return &keyword[i].second;
    }
  }
  return nullptr;
}

Status CallArgs::check_all_used(const std::string& callee) const {
  for (size_t i = 0; i < positional.size(); ++i)
    if (i >= used_positional_.size() || !used_positional_[i])
      return Status::errorf("{} takes at most {} positional argument(s), got {}", callee, i,
                            positional.size());
  for (size_t i = 0; i < keyword.size(); ++i)
    if (i >= used_keyword_.size() || !used_keyword_[i])
      return Status::errorf("{} got an unexpected keyword argument '{}'", callee, keyword[i].first);
  return Status::ok();
}

namespace {

Status undefined_error(const Value& v) {
  return Status::error(v.text.empty() ? std::string("value is undefined") : v.text);
}

std::string object_description(const Value& v) {
  if (v.is_none()) return "'None'";
  return fmt::format("'{} object'", type_name(v));
}

bool add_overflows(int64_t a, int64_t b, int64_t& out) {
  return __builtin_add_overflow(a, b, &out);
}
bool sub_overflows(int64_t a, int64_t b, int64_t& out) {
  return __builtin_sub_overflow(a, b, &out);
}
bool mul_overflows(int64_t a, int64_t b, int64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

Status overflow(const char* op) {
  return Status::errorf("integer overflow in '{}' (integers beyond 64 bits are not supported)", op);
}

// Python's float floor division and modulo (CPython float_divmod).
std::pair<double, double> float_divmod(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return {floordiv, mod};
}

Result<Value> repeat(const Renderer& r, const Value& sequence, int64_t times) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    if (times > 0 &&
        sequence.text.size() > r.limits().max_output_bytes / static_cast<uint64_t>(times))
      return Status::errorf("string repetition would exceed {} bytes", r.limits().max_output_bytes);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.text;
    return Value::from_string(std::move(out));
  }
  if (times > 0 && sequence.list->size() > r.limits().max_list_items / static_cast<uint64_t>(times))
    return Status::errorf("list repetition would exceed {} items", r.limits().max_list_items);
  ValueList out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), sequence.list->begin(), sequence.list->end());
  return Value::from_list(std::move(out), sequence.kind == Kind::kTuple);
}

// Python's slice index adjustment (PySlice_AdjustIndices).
Result<bool> slice_bound(const Value* v, int64_t& out) {
  if (!v || v->is_none()) return false;
  if (!v->is_integral()) return Status::error("slice indices must be integers or None");
  out = v->as_int();
  return true;
}

}  // namespace

std::tm Renderer::now() const {
  if (now_) return *now_;
  std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  return local;
}

Status Renderer::charge_iterations(size_t count) {
  iterations_ += static_cast<int64_t>(count);
  if (iterations_ > limits_.max_loop_iterations)
    return Status::errorf("template exceeded {} loop iterations", limits_.max_loop_iterations);
  return Status::ok();
}

Status Renderer::check_string_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    return Status::errorf("template built a string over {} bytes", limits_.max_output_bytes);
  return Status::ok();
}

Status Renderer::check_list_size(size_t items) const {
  if (items > limits_.max_list_items)
    return Status::errorf("template built a list over {} items", limits_.max_list_items);
  return Status::ok();
}

Status Renderer::render(const Body& body, const ScopePtr& scope, std::string& out) {
  Flow flow = Flow::kNormal;
  return exec_body(body, scope, out, flow);
}

Status Renderer::exec_body(const Body& body, const ScopePtr& scope, std::string& out, Flow& flow) {
  for (const Stmt& stmt : body) {
    SY_TRY(exec(stmt, scope, out, flow));
    if (flow != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

Status Renderer::exec(const Stmt& stmt, const ScopePtr& scope, std::string& out, Flow& flow) {
  auto at_line = [&](const Status& s) {
    return s.with_context(fmt::format("line {}: ", stmt.line));
  };
  switch (stmt.kind) {
    case Stmt::Kind::kText:
      out += stmt.text;
      return check_string_size(out.size());
    case Stmt::Kind::kOutput: {
      auto value = eval(*stmt.expr, scope);
      if (!value) return value.status();
      auto text = to_str(*value);
      if (!text) return at_line(text.status());
      out += *text;
      return check_string_size(out.size());
    }
    case Stmt::Kind::kIf:
      for (const auto& [condition, branch] : stmt.branches) {
        SY_ASSIGN(Value test, eval(*condition, scope));
        if (truthy(test)) return exec_body(branch, scope, out, flow);
      }
      return exec_body(stmt.else_body, scope, out, flow);
    case Stmt::Kind::kFor:
      return exec_for(stmt, scope, out);
    case Stmt::Kind::kSet: {
      SY_ASSIGN(Value value, eval(*stmt.expr, scope));
      if (!stmt.attribute.empty()) {
        Value* target = scope->find(stmt.targets[0]);
        if (!target || target->kind != Kind::kNamespace)
          return Status::errorf("line {}: cannot assign attribute '{}' on '{}': not a namespace()",
                                stmt.line, stmt.attribute, stmt.targets[0]);
        target->dict->set(stmt.attribute, std::move(value));
        return Status::ok();
      }
      return assign(stmt.targets, std::move(value), *scope, stmt.line);
    }
    case Stmt::Kind::kSetBlock: {
      std::string captured;
      SY_TRY(render(stmt.body, std::make_shared<Scope>(scope), captured));
      scope->vars[stmt.targets[0]] = Value::from_string(std::move(captured));
      return Status::ok();
    }
    case Stmt::Kind::kMacro:
      scope->vars[stmt.name] = make_macro(stmt, scope);
      return Status::ok();
    case Stmt::Kind::kBreak:
      flow = Flow::kBreak;
      return Status::ok();
    case Stmt::Kind::kContinue:
      flow = Flow::kContinue;
      return Status::ok();
    case Stmt::Kind::kGeneration:
      return render(stmt.body, std::make_shared<Scope>(scope), out);
  }
  return Status::ok();
}

Status Renderer::assign(const std::vector<std::string>& targets, Value value, Scope& scope,
                        int line) {
  if (targets.size() == 1) {
    scope.vars[targets[0]] = std::move(value);
    return Status::ok();
  }
  auto items = iterate(value);
  if (!items) return items.status().with_context(fmt::format("line {}: cannot unpack: ", line));
  if (items->size() != targets.size())
    return Status::errorf("line {}: {} values to unpack (expected {}, got {})", line,
                          items->size() < targets.size() ? "not enough" : "too many",
                          targets.size(), items->size());
  for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = (*items)[i];
  return Status::ok();
}

Status Renderer::exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  SY_ASSIGN(Value iterable, eval(*stmt.expr, scope));
  auto listed = iterate(iterable);
  if (!listed) return listed.status().with_context(fmt::format("line {}: ", stmt.line));
  ValueList items = std::move(*listed);
  SY_TRY(charge_iterations(items.size()));
  if (stmt.filter) {
    ValueList kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>(scope);
      SY_TRY(assign(stmt.targets, item, *probe, stmt.line));
      SY_ASSIGN(Value keep, eval(*stmt.filter, probe));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Flow flow = Flow::kNormal;
    return exec_body(stmt.else_body, std::make_shared<Scope>(scope), out, flow);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    auto iteration = std::make_shared<Scope>(scope);
    SY_TRY(assign(stmt.targets, items[i], *iteration, stmt.line));
    Dict loop;
    loop.entries.reserve(12);
    loop.set("index", Value::from_int(i + 1));
    loop.set("index0", Value::from_int(i));
    loop.set("revindex", Value::from_int(length - i));
    loop.set("revindex0", Value::from_int(length - i - 1));
    loop.set("first", Value::from_bool(i == 0));
    loop.set("last", Value::from_bool(i == length - 1));
    loop.set("length", Value::from_int(length));
    loop.set("depth", Value::from_int(1));
    loop.set("depth0", Value::from_int(0));
    loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < length ? items[i + 1] : Value::undefined("there is no next item"));
    loop.set("cycle",
             Value::from_function("loop.cycle", [i](Renderer&, CallArgs& args) -> Result<Value> {
               if (args.positional.empty())
                 return Status::error("loop.cycle() needs at least one argument");
               if (!args.keyword.empty())
                 return Status::error("loop.cycle() takes no keyword arguments");
               return args.positional[static_cast<size_t>(i) % args.positional.size()];
             }));
    iteration->vars["loop"] = Value::from_dict(std::move(loop));
    Flow flow = Flow::kNormal;
    SY_TRY(exec_body(stmt.body, iteration, out, flow));
    if (flow == Flow::kBreak) break;
  }
  return Status::ok();
}

Value Renderer::make_macro(const Stmt& stmt, const ScopePtr& scope) {
  const Stmt* definition = &stmt;
  std::weak_ptr<Scope> closure = scope;
  return Value::from_function(
      "macro '" + stmt.name + "'",
      [definition, closure](Renderer& r, CallArgs& args) -> Result<Value> {
        const Stmt& def = *definition;
        ScopePtr parent = closure.lock();
        if (!parent) return Status::errorf("macro '{}' called after its scope ended", def.name);
        if (r.call_depth_ >= r.limits_.max_call_depth)
          return Status::errorf("macro '{}': calls nested deeper than {}", def.name,
                                r.limits_.max_call_depth);
        auto local = std::make_shared<Scope>(parent);
        const size_t params = def.params.size();
        if (args.positional.size() > params && !def.catches_varargs)
          return Status::errorf("macro '{}' takes not more than {} argument(s)", def.name, params);
        std::vector<bool> given(params, false);
        for (size_t i = 0; i < params && i < args.positional.size(); ++i) {
          local->vars[def.params[i].first] = args.positional[i];
          given[i] = true;
        }
        Dict extra_keywords;
        for (auto& [key, value] : args.keyword) {
          size_t index = params;
          for (size_t i = 0; i < params; ++i)
            if (def.params[i].first == key) index = i;
          if (index == params) {
            if (!def.catches_kwargs)
              return Status::errorf("macro '{}' takes no keyword argument '{}'", def.name, key);
            extra_keywords.set(key, value);
            continue;
          }
          if (given[index])
            return Status::errorf("macro '{}' got multiple values for argument '{}'", def.name,
                                  key);
          local->vars[key] = value;
          given[index] = true;
        }
        for (size_t i = 0; i < params; ++i) {
          if (given[i]) continue;
          const auto& [name, default_value] = def.params[i];
          if (default_value) {
            SY_ASSIGN(Value v, r.eval(*default_value, local));
            local->vars[name] = std::move(v);
          } else {
            local->vars[name] =
                Value::undefined(fmt::format("parameter '{}' was not provided", name));
          }
        }
        if (def.catches_varargs) {
          ValueList rest;
          for (size_t i = params; i < args.positional.size(); ++i)
            rest.push_back(args.positional[i]);
          local->vars["varargs"] = Value::from_list(std::move(rest), true);
        }
        if (def.catches_kwargs) local->vars["kwargs"] = Value::from_dict(std::move(extra_keywords));
        std::string out;
        ++r.call_depth_;
        Status status = r.render(def.body, local, out);
        --r.call_depth_;
        SY_TRY(status);
        return Value::from_string(std::move(out));
      });
}

Result<ValueList> Renderer::iterate(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined:
      return ValueList{};
    case Kind::kList:
    case Kind::kTuple:
      return *value.list;
    case Kind::kString: {
      ValueList out;
      for (std::string_view cp : code_points(value.text))
        out.push_back(Value::from_string(std::string(cp)));
      return out;
    }
    case Kind::kDict: {
      ValueList out;
      for (const auto& entry : value.dict->entries) out.push_back(Value::from_string(entry.first));
      return out;
    }
    default:
      return Status::errorf("'{}' object is not iterable", type_name(value));
  }
}

Result<Value> Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.kind == Kind::kCallable) return callee.function->call(*this, args);
  if (callee.is_undefined()) return undefined_error(callee);
  return Status::errorf("'{}' object is not callable", type_name(callee));
}

Result<Value> Renderer::get_attr(const Value& object, const std::string& name) {
  if (object.is_undefined()) return undefined_error(object);
  if (!name.empty() && name[0] == '_')
    return Status::errorf("access to attribute '{}' is not supported (sandboxed)", name);
  if (std::optional<Value> method = find_method(object, name)) return *method;
  if (object.kind == Kind::kDict || object.kind == Kind::kNamespace) {
    if (const Value* v = object.dict->find(name)) return *v;
  }
  return Value::undefined(
      fmt::format("{} has no attribute '{}'", object_description(object), name));
}

Result<Value> Renderer::get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return undefined_error(object);
  switch (object.kind) {
    case Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = object.dict->find(key.text)) return *v;
      }
      break;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kString: {
      if (object.kind == Kind::kList && object.flavor != ListFlavor::kPlain &&
          object.flavor != ListFlavor::kRange)
        break;
      if (!key.is_integral()) break;
      int64_t index = key.as_int();
      if (object.is_string()) {
        auto points = code_points(object.text);
        int64_t n = static_cast<int64_t>(points.size());
        if (index < 0) index += n;
        if (index >= 0 && index < n)
          return Value::from_string(std::string(points[static_cast<size_t>(index)]));
        return Value::undefined(fmt::format("str object has no element {}", key.as_int()));
      }
      int64_t n = static_cast<int64_t>(object.list->size());
      if (index < 0) index += n;
      if (index >= 0 && index < n) return (*object.list)[static_cast<size_t>(index)];
      return Value::undefined(
          fmt::format("{} object has no element {}", type_name(object), key.as_int()));
    }
    default:
      break;
  }
  // jinja2 falls back to the attribute of that name (d['items'] is the method when no such key).
  if (key.is_string()) return get_attr(object, key.text);
  SY_ASSIGN(std::string shown, to_repr(key));
  return Value::undefined(fmt::format("{} has no element {}", object_description(object), shown));
}

Result<Value> Renderer::eval(const Expr& expr, const ScopePtr& scope) {
  if (++steps_ > limits_.max_steps)
    return Status::errorf("template exceeded {} evaluation steps", limits_.max_steps);
  auto at_line = [&](const Status& s) {
    return s.with_context(fmt::format("line {}: ", expr.line));
  };
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName: {
      if (Value* v = scope->find(expr.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", expr.name));
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const auto& item : expr.args) {
        SY_ASSIGN(Value v, eval(*item, scope));
        items.push_back(std::move(v));
      }
      return Value::from_list(std::move(items), expr.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Dict dict;
      for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
        SY_ASSIGN(Value key, eval(*expr.args[i], scope));
        if (!key.is_string())
          return at_line(Status::error("dict literal keys other than strings are not supported"));
        SY_ASSIGN(Value value, eval(*expr.args[i + 1], scope));
        dict.set(key.text, std::move(value));
      }
      return Value::from_dict(std::move(dict));
    }
    case Expr::Kind::kGetAttr: {
      SY_ASSIGN(Value object, eval(*expr.args[0], scope));
      auto v = get_attr(object, expr.name);
      if (!v) return at_line(v.status());
      return v;
    }
    case Expr::Kind::kGetItem: {
      SY_ASSIGN(Value object, eval(*expr.args[0], scope));
      SY_ASSIGN(Value key, eval(*expr.args[1], scope));
      auto v = get_item(object, key);
      if (!v) return at_line(v.status());
      return v;
    }
    case Expr::Kind::kSlice: {
      SY_ASSIGN(Value object, eval(*expr.args[0], scope));
      if (object.is_undefined()) return at_line(undefined_error(object));
      Value bounds[3];
      for (int i = 0; i < 3; ++i) {
        if (expr.args[i + 1]) {
          SY_ASSIGN(bounds[i], eval(*expr.args[i + 1], scope));
        } else {
          bounds[i] = Value::none();
        }
      }
      bool sliceable = object.is_string() || object.kind == Kind::kTuple ||
                       (object.kind == Kind::kList && (object.flavor == ListFlavor::kPlain ||
                                                       object.flavor == ListFlavor::kRange));
      if (!sliceable)
        return Value::undefined(fmt::format("{} cannot be sliced", object_description(object)));
      int64_t start = 0, stop = 0, step = 1;
      auto has_step = slice_bound(&bounds[2], step);
      auto has_start = slice_bound(&bounds[0], start);
      auto has_stop = slice_bound(&bounds[1], stop);
      if (!has_step || !has_start || !has_stop)
        return Value::undefined("slice indices must be integers or None");
      if (*has_step && step == 0) return at_line(Status::error("slice step cannot be zero"));
      if (!*has_step) step = 1;
      std::vector<std::string_view> points;
      if (object.is_string()) points = code_points(object.text);
      const int64_t n = object.is_string() ? static_cast<int64_t>(points.size())
                                           : static_cast<int64_t>(object.list->size());
      auto adjust = [&](bool given, int64_t& index, int64_t default_value) {
        if (!given) {
          index = default_value;
          return;
        }
        if (index < 0) {
          index += n;
          if (index < 0) index = step < 0 ? -1 : 0;
        } else if (index >= n) {
          index = step < 0 ? n - 1 : n;
        }
      };
      adjust(*has_start, start, step < 0 ? n - 1 : 0);
      adjust(*has_stop, stop, step < 0 ? -1 : n);
      std::string text;
      ValueList items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (object.is_string())
          text += points[static_cast<size_t>(i)];
        else
          items.push_back((*object.list)[static_cast<size_t>(i)]);
      }
      if (object.is_string()) return Value::from_string(std::move(text));
      return Value::from_list(std::move(items), object.kind == Kind::kTuple);
    }
    case Expr::Kind::kCall:
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest: {
      SY_ASSIGN(Value subject, eval(*expr.args[0], scope));
      CallArgs args;
      for (size_t i = 1; i < expr.args.size(); ++i) {
        SY_ASSIGN(Value v, eval(*expr.args[i], scope));
        args.positional.push_back(std::move(v));
      }
      for (const auto& [key, value_expr] : expr.kwargs) {
        SY_ASSIGN(Value v, eval(*value_expr, scope));
        args.keyword.emplace_back(key, std::move(v));
      }
      if (expr.kind == Expr::Kind::kCall) {
        auto v = call(subject, args);
        if (!v) return at_line(v.status());
        return v;
      }
      if (expr.kind == Expr::Kind::kFilter) {
        auto v = apply_filter(*this, expr.name, subject, args);
        if (!v) return at_line(v.status().with_context(fmt::format("filter '{}': ", expr.name)));
        return v;
      }
      auto passed = apply_test(*this, expr.name, subject, args);
      if (!passed)
        return at_line(passed.status().with_context(fmt::format("test '{}': ", expr.name)));
      return Value::from_bool(*passed != expr.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      SY_ASSIGN(Value operand, eval(*expr.args[0], scope));
      if (operand.is_undefined()) return at_line(undefined_error(operand));
      if (!operand.is_number())
        return at_line(Status::errorf("bad operand type for unary {}: '{}'",
                                      expr.kind == Expr::Kind::kNeg ? '-' : '+',
                                      type_name(operand)));
      if (expr.kind == Expr::Kind::kPos)
        return operand.is_integral() ? Value::from_int(operand.as_int()) : operand;
      if (operand.kind == Kind::kFloat) return Value::from_float(-operand.number);
      if (operand.as_int() == std::numeric_limits<int64_t>::min()) return at_line(overflow("-"));
      return Value::from_int(-operand.as_int());
    }
    case Expr::Kind::kNot: {
      SY_ASSIGN(Value operand, eval(*expr.args[0], scope));
      return Value::from_bool(!truthy(operand));
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      SY_ASSIGN(Value left, eval(*expr.args[0], scope));
      if (truthy(left) == (expr.kind == Expr::Kind::kOr)) return left;
      return eval(*expr.args[1], scope);
    }
    case Expr::Kind::kBinary: {
      SY_ASSIGN(Value left, eval(*expr.args[0], scope));
      SY_ASSIGN(Value right, eval(*expr.args[1], scope));
      auto v = eval_binary(expr.name, left, right);
      if (!v) return at_line(v.status());
      return v;
    }
    case Expr::Kind::kCompare: {
      SY_ASSIGN(Value left, eval(*expr.args[0], scope));
      for (size_t i = 0; i < expr.ops.size(); ++i) {
        SY_ASSIGN(Value right, eval(*expr.args[i + 1], scope));
        auto holds = eval_compare(expr.ops[i], left, right);
        if (!holds) return at_line(holds.status());
        if (!*holds) return Value::from_bool(false);
        left = std::move(right);
      }
      return Value::from_bool(true);
    }
    case Expr::Kind::kConditional: {
      SY_ASSIGN(Value condition, eval(*expr.args[1], scope));
      if (truthy(condition)) return eval(*expr.args[0], scope);
      if (expr.args[2]) return eval(*expr.args[2], scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined",
          expr.line));
    }
  }
  return Status::error("unknown expression");
}

Result<bool> Renderer::eval_compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in" || op == "notin") {
    bool negate = op == "notin";
    switch (b.kind) {
      case Kind::kUndefined:
        return negate;
      case Kind::kString:
        if (!a.is_string())
          return Status::errorf("'in <string>' requires string as left operand, not {}",
                                type_name(a));
        return (b.text.find(a.text) != std::string::npos) != negate;
      case Kind::kList:
      case Kind::kTuple:
        for (const Value& item : *b.list)
          if (equal(item, a)) return !negate;
        return negate;
      case Kind::kDict:
        if (a.is_sequence() && a.kind == Kind::kList)
          return Status::error("unhashable type: 'list'");
        if (a.is_mapping()) return Status::error("unhashable type: 'dict'");
        return (a.is_string() && b.dict->find(a.text) != nullptr) != negate;
      default:
        return Status::errorf("argument of type '{}' is not iterable", type_name(b));
    }
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  auto not_supported = [&]() {
    return Status::errorf("'{}' not supported between instances of '{}' and '{}'", op, type_name(a),
                          type_name(b));
  };
  bool comparable = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
                    (a.is_sequence() && a.kind == b.kind);
  if (!comparable) return not_supported();
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") {
    SY_ASSIGN(bool greater, less(b, a));
    return !greater;
  }
  if (op == ">=") {
    SY_ASSIGN(bool smaller, less(a, b));
    return !smaller;
  }
  return Status::errorf("unknown comparison '{}'", op);
}

Result<Value> Renderer::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (a.markup || b.markup)
    return Status::errorf("'{}' on a Markup string (the result of |safe) is not supported", op);
  if (op == "~") {
    SY_ASSIGN(std::string left, to_str(a));
    SY_ASSIGN(std::string right, to_str(b));
    SY_TRY(check_string_size(left.size() + right.size()));
    return Value::from_string(left + right);
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  auto unsupported = [&]() {
    return Status::errorf("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                          type_name(b));
  };
  const bool numbers = a.is_number() && b.is_number();
  const bool integers = a.is_integral() && b.is_integral();
  if (op == "+") {
    if (integers) {
      int64_t out;
      if (add_overflows(a.as_int(), b.as_int(), out)) return overflow("+");
      return Value::from_int(out);
    }
    if (numbers) return Value::from_float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      SY_TRY(check_string_size(a.text.size() + b.text.size()));
      return Value::from_string(a.text + b.text);
    }
    bool plain_lists = a.kind == Kind::kList && b.kind == Kind::kList &&
                       a.flavor == ListFlavor::kPlain && b.flavor == ListFlavor::kPlain;
    if (plain_lists || (a.kind == Kind::kTuple && b.kind == Kind::kTuple)) {
      SY_TRY(check_list_size(a.list->size() + b.list->size()));
      ValueList items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::from_list(std::move(items), a.kind == Kind::kTuple);
    }
    if (a.is_string())
      return Status::errorf("can only concatenate str (not \"{}\") to str", type_name(b));
    if (a.kind == Kind::kList)
      return Status::errorf("can only concatenate list (not \"{}\") to list", type_name(b));
    return unsupported();
  }
  if (op == "-") {
    if (integers) {
      int64_t out;
      if (sub_overflows(a.as_int(), b.as_int(), out)) return overflow("-");
      return Value::from_int(out);
    }
    if (numbers) return Value::from_float(a.as_double() - b.as_double());
    return unsupported();
  }
  if (op == "*") {
    if (integers) {
      int64_t out;
      if (mul_overflows(a.as_int(), b.as_int(), out)) return overflow("*");
      return Value::from_int(out);
    }
    if (numbers) return Value::from_float(a.as_double() * b.as_double());
    auto repeatable = [](const Value& v) {
      return v.is_string() || v.kind == Kind::kTuple ||
             (v.kind == Kind::kList && v.flavor == ListFlavor::kPlain);
    };
    if (repeatable(a) && b.is_integral()) return repeat(*this, a, b.as_int());
    if (a.is_integral() && repeatable(b)) return repeat(*this, b, a.as_int());
    return unsupported();
  }
  if (op == "/") {
    if (!numbers) return unsupported();
    if (b.as_double() == 0) return Status::error("division by zero");
    return Value::from_float(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%") return Status::error("'%' string formatting is not supported");
    if (!numbers) return unsupported();
    if (integers) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) return Status::error("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return overflow(op.c_str());
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        q -= 1;
        m += y;
      }
      return Value::from_int(op == "//" ? q : m);
    }
    if (b.as_double() == 0) return Status::error("float divmod() by zero");
    auto [div, mod] = float_divmod(a.as_double(), b.as_double());
    return Value::from_float(op == "//" ? div : mod);
  }
  if (op == "**") {
    if (!numbers) return unsupported();
    if (integers && b.as_int() >= 0) {
      int64_t base = a.as_int(), exponent = b.as_int(), result = 1;
      while (exponent > 0) {
        if (exponent & 1) {
          if (mul_overflows(result, base, result)) return overflow("**");
        }
        exponent >>= 1;
        if (exponent > 0 && mul_overflows(base, base, base)) return overflow("**");
      }
      return Value::from_int(result);
    }
    double x = a.as_double(), y = b.as_double();
    if (x == 0 && y < 0) return Status::error("0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y))
      return Status::error("a negative number to a fractional power (complex) is not supported");
    double result = std::pow(x, y);
    if (std::isinf(result) && std::isfinite(x) && std::isfinite(y))
      return Status::error("numerical result out of range");
    return Value::from_float(result);
  }
  return Status::errorf("unknown operator '{}'", op);
}

}  // namespace sy::chat
