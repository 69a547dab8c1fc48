// The parsed form of a chat template: expressions and statements, immutable after parsing (so one
// ChatTemplate renders from many threads at once).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace sy::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // args = items
    kTuple,        // args = items
    kDict,         // args = key0, value0, key1, value1, ...
    kGetAttr,      // args[0] . name
    kGetItem,      // args[0] [ args[1] ]
    kSlice,        // args[0] [ args[1] : args[2] : args[3] ]  (null = omitted)
    kCall,         // args[0] ( args[1..] , kwargs )
    kFilter,       // args[0] | name ( args[1..], kwargs )
    kTest,         // args[0] is [not] name ( args[1..] )
    kNeg,          // - args[0]
    kPos,          // + args[0]
    kNot,          // not args[0]
    kBinary,       // args[0] name args[1]: + - * / // % ** ~
    kAnd,          // args[0] and args[1]
    kOr,           // args[0] or args[1]
    kCompare,      // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kConditional,  // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body)...; else_body
    kFor,       // targets in expr [if filter] body [else else_body]
    kSet,       // targets = expr, or target.attr = expr
    kSetBlock,  // {% set target %}body{% endset %}
    kMacro,     // name(params) body
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: renders body
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attribute;  // kSet on a namespace: {% set ns.attribute = ... %}
  std::string name;       // macro name
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro params and defaults (null = none)
  bool catches_varargs =
      false;  // macro body mentions `varargs` / `kwargs` (jinja2 then accepts extras)
  bool catches_kwargs = false;
};

}  // namespace sy::chat
