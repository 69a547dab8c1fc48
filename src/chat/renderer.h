// Executes a parsed template against a context, with jinja2's scoping (loops and macros open a
// scope, if/set do not) and hard limits on work, recursion and output so hostile input cannot
// hang or exhaust the process.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"

namespace sy::chat {

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;      // also the largest string any operation may build
  int64_t max_loop_iterations = 1'000'000;  // all loops and filters of one render together
  int max_call_depth = 64;                  // macro recursion
  int64_t max_steps = 20'000'000;           // expression evaluations
  size_t max_list_items = 1'000'000;
};

struct Scope {
  explicit Scope(std::shared_ptr<Scope> parent_scope) : parent(std::move(parent_scope)) {}
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
  Value* find(const std::string& name) {
    for (Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name` (nullptr if absent); marks it used.
  const Value* get(size_t index, const char* name);
  void mark_all_used() {
    used_positional_.assign(positional.size(), true);
    used_keyword_.assign(keyword.size(), true);
  }
  // Error naming the first argument nobody asked for (jinja2 raises TypeError for those).
  Status check_all_used(const std::string& callee) const;

 private:
  std::vector<bool> used_positional_;
  std::vector<bool> used_keyword_;
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const RenderLimits& limits, std::optional<std::tm> now) : limits_(limits), now_(now) {}

  Status render(const Body& body, const ScopePtr& scope, std::string& out);
  Result<Value> eval(const Expr& expr, const ScopePtr& scope);
  Result<Value> call(const Value& callee, CallArgs& args);

  Result<Value> get_attr(const Value& object, const std::string& name);
  Result<Value> get_item(const Value& object, const Value& key);
  // Items of an iterable as Python iterates them (str: code points, dict: keys, Undefined: none).
  Result<ValueList> iterate(const Value& value);
  // Every loop and filter iteration is charged here.
  Status charge_iterations(size_t count);
  Status check_string_size(size_t bytes) const;
  Status check_list_size(size_t items) const;

  const RenderLimits& limits() const { return limits_; }
  std::tm now() const;

 private:
  Status exec(const Stmt& stmt, const ScopePtr& scope, std::string& out, Flow& flow);
  Status exec_body(const Body& body, const ScopePtr& scope, std::string& out, Flow& flow);
  Status exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  Status assign(const std::vector<std::string>& targets, Value value, Scope& scope, int line);
  Value make_macro(const Stmt& stmt, const ScopePtr& scope);
  Result<Value> eval_binary(const std::string& op, const Value& a, const Value& b);
  Result<bool> eval_compare(const std::string& op, const Value& a, const Value& b);

  RenderLimits limits_;
  std::optional<std::tm> now_;
  int64_t steps_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace sy::chat
