#include "chat/parser.h"

#include <fmt/format.h>

#include <algorithm>

#include "chat/builtins.h"

namespace sy::chat {
namespace {

const char* describe(const Token& t) {
  switch (t.type) {
    case TokenType::kText:
      return "text";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "end of print statement '}}'";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "end of statement block '%}'";
    case TokenType::kEnd:
      return "end of template";
    default:
      return nullptr;
  }
}

Stmt make_stmt(Stmt::Kind kind) {
  Stmt s;
  s.kind = kind;
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<Body> parse_template() {
    Body body;
    std::string end;
    SY_TRY(parse_body(body, {}, end));
    return body;
  }

 private:
  // RAII depth guard shared by statements and expressions.
  struct Nest {
    explicit Nest(Parser& p) : parser(p) { ++parser.depth_; }
    ~Nest() { --parser.depth_; }
    Parser& parser;
  };
  Status check_depth() const {
    if (depth_ > kMaxParseDepth)
      return Status::errorf("line {}: template nested more than {} levels deep", current().line,
                            kMaxParseDepth);
    return Status::ok();
  }

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const {
    return current().type == TokenType::kOperator && current().value == op;
  }
  bool is_name(const char* name) const {
    return current().type == TokenType::kName && current().value == name;
  }
  std::string shown(const Token& t) const {
    if (const char* d = describe(t)) return d;
    return fmt::format("'{}'", t.value);
  }
  Status unexpected(const std::string& expected) const {
    return Status::errorf("line {}: expected {}, got {}", current().line, expected,
                          shown(current()));
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return unexpected(fmt::format("'{}'", op));
    advance();
    return Status::ok();
  }
  Status expect(TokenType type) {
    if (current().type != type) {
      Token wanted{type, "", 0, 0, 0};
      return unexpected(describe(wanted));
    }
    advance();
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (current().type != TokenType::kName) return unexpected("a name");
    std::string name = current().value;
    advance();
    return name;
  }

  // ---- statements ----

  // Parses until one of `end_tags` opens a block ({% endif %}, {% else %}...); leaves the parser on
  // that tag's name and reports which one in `found`.
  Status parse_body(Body& body, std::vector<std::string> end_tags, std::string& found) {
    Nest nest(*this);
    SY_TRY(check_depth());
    while (true) {
      const Token& t = current();
      switch (t.type) {
        case TokenType::kText: {
          Stmt s = make_stmt(Stmt::Kind::kText);
          s.line = t.line;
          s.text = t.value;
          body.push_back(std::move(s));
          advance();
          break;
        }
        case TokenType::kVariableBegin: {
          int line = t.line;
          advance();
          SY_ASSIGN(ExprPtr e, parse_tuple(true, false));
          SY_TRY(expect(TokenType::kVariableEnd));
          Stmt s = make_stmt(Stmt::Kind::kOutput);
          s.line = line;
          s.expr = std::move(e);
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& keyword = peek();
          if (keyword.type != TokenType::kName) {
            advance();
            return unexpected("a statement name after '{%'");
          }
          if (std::find(end_tags.begin(), end_tags.end(), keyword.value) != end_tags.end()) {
            advance();
            found = keyword.value;
            return Status::ok();
          }
          SY_TRY(parse_statement(body));
          break;
        }
        case TokenType::kEnd:
          if (end_tags.empty()) return Status::ok();
          return Status::errorf("line {}: unexpected end of template; expected {}", t.line,
                                fmt::join(quote_all(end_tags), " or "));
        default:
          return unexpected("text or a tag");
      }
    }
  }

  static std::vector<std::string> quote_all(const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const auto& n : names) out.push_back("'" + n + "'");
    return out;
  }

  // Consumes `%}` after an end tag name the parser is on (e.g. after parse_body found "endif").
  Status finish_tag() {
    advance();  // the tag name
    return expect(TokenType::kBlockEnd);
  }

  Status parse_statement(Body& body) {
    advance();  // {%
    const Token& keyword = current();
    int line = keyword.line;
    std::string name = keyword.value;
    advance();
    if (name == "if") return parse_if(body, line);
    if (name == "for") return parse_for(body, line);
    if (name == "set") return parse_set(body, line);
    if (name == "macro") return parse_macro(body, line);
    if (name == "generation") {
      Stmt s = make_stmt(Stmt::Kind::kGeneration);
      s.line = line;
      SY_TRY(expect(TokenType::kBlockEnd));
      std::string found;
      SY_TRY(parse_body(s.body, {"endgeneration"}, found));
      SY_TRY(finish_tag());
      body.push_back(std::move(s));
      return Status::ok();
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Status::errorf("line {}: '{}' outside a for loop", line, name);
      Stmt s = make_stmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue);
      s.line = line;
      SY_TRY(expect(TokenType::kBlockEnd));
      body.push_back(std::move(s));
      return Status::ok();
    }
    static const char* kKnownUnsupported[] = {
        "include", "import", "from",       "extends", "block", "call",     "filter",
        "with",    "raw",    "autoescape", "do",      "trans", "pluralize"};
    for (const char* tag : kKnownUnsupported)
      if (name == tag)
        return Status::errorf("line {}: the '{{% {} %}}' tag is not supported", line, name);
    return Status::errorf("line {}: unknown tag '{}'", line, name);
  }

  Status parse_if(Body& body, int line) {
    Stmt s = make_stmt(Stmt::Kind::kIf);
    s.line = line;
    while (true) {
      SY_ASSIGN(ExprPtr condition, parse_tuple(false, false));
      SY_TRY(expect(TokenType::kBlockEnd));
      Body branch;
      std::string found;
      SY_TRY(parse_body(branch, {"elif", "else", "endif"}, found));
      s.branches.emplace_back(std::move(condition), std::move(branch));
      if (found == "elif") {
        advance();
        continue;
      }
      if (found == "else") {
        SY_TRY(finish_tag());
        SY_TRY(parse_body(s.else_body, {"endif"}, found));
      }
      SY_TRY(finish_tag());
      break;
    }
    body.push_back(std::move(s));
    return Status::ok();
  }

  Status parse_targets(std::vector<std::string>& targets) {
    bool parens = is_op("(");
    if (parens) advance();
    while (true) {
      SY_ASSIGN(std::string name, expect_name());
      targets.push_back(std::move(name));
      if (!is_op(",")) break;
      advance();
      if (current().type != TokenType::kName) break;  // trailing comma
    }
    if (parens) SY_TRY(expect_op(")"));
    return Status::ok();
  }

  Status parse_for(Body& body, int line) {
    Stmt s = make_stmt(Stmt::Kind::kFor);
    s.line = line;
    SY_TRY(parse_targets(s.targets));
    if (!is_name("in")) return unexpected("'in'");
    advance();
    SY_ASSIGN(s.expr, parse_tuple(false, false));
    if (is_name("if")) {
      advance();
      SY_ASSIGN(s.filter, parse_expression());
    }
    if (is_name("recursive"))
      return Status::errorf("line {}: recursive for loops are not supported", line);
    SY_TRY(expect(TokenType::kBlockEnd));
    ++loop_depth_;
    std::string found;
    Status status = parse_body(s.body, {"endfor", "else"}, found);
    --loop_depth_;
    SY_TRY(status);
    if (found == "else") {
      SY_TRY(finish_tag());
      SY_TRY(parse_body(s.else_body, {"endfor"}, found));
    }
    SY_TRY(finish_tag());
    body.push_back(std::move(s));
    return Status::ok();
  }

  Status parse_set(Body& body, int line) {
    std::vector<std::string> targets;
    std::string attribute;
    if (current().type == TokenType::kName && peek().type == TokenType::kOperator &&
        peek().value == ".") {
      targets.push_back(current().value);
      advance();
      advance();
      SY_ASSIGN(attribute, expect_name());
    } else {
      SY_TRY(parse_targets(targets));
    }
    if (is_op("=")) {
      advance();
      Stmt s = make_stmt(Stmt::Kind::kSet);
      s.line = line;
      s.targets = std::move(targets);
      s.attribute = std::move(attribute);
      SY_ASSIGN(s.expr, parse_tuple(true, false));
      SY_TRY(expect(TokenType::kBlockEnd));
      body.push_back(std::move(s));
      return Status::ok();
    }
    if (is_op("|"))
      return Status::errorf("line {}: filters on block set ('{{% set x | f %}}') are not supported",
                            line);
    if (targets.size() != 1 || !attribute.empty())
      return Status::errorf(
          "line {}: a block set ('{{% set x %}}...{{% endset %}}') takes one plain name", line);
    Stmt s = make_stmt(Stmt::Kind::kSetBlock);
    s.line = line;
    s.targets = std::move(targets);
    SY_TRY(expect(TokenType::kBlockEnd));
    std::string found;
    SY_TRY(parse_body(s.body, {"endset"}, found));
    SY_TRY(finish_tag());
    body.push_back(std::move(s));
    return Status::ok();
  }

  Status parse_macro(Body& body, int line) {
    Stmt s = make_stmt(Stmt::Kind::kMacro);
    s.line = line;
    SY_ASSIGN(s.name, expect_name());
    SY_TRY(expect_op("("));
    while (!is_op(")")) {
      if (!s.params.empty()) SY_TRY(expect_op(","));
      if (is_op(")")) break;
      SY_ASSIGN(std::string param, expect_name());
      ExprPtr default_value;
      if (is_op("=")) {
        advance();
        SY_ASSIGN(default_value, parse_expression());
      } else if (!s.params.empty() && s.params.back().second) {
        return Status::errorf(
            "line {}: macro '{}': parameter '{}' without a default follows one with a default",
            line, s.name, param);
      }
      s.params.emplace_back(std::move(param), std::move(default_value));
    }
    advance();  // )
    SY_TRY(expect(TokenType::kBlockEnd));
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    macro_mentions_.push_back({false, false});
    std::string found;
    Status status = parse_body(s.body, {"endmacro"}, found);
    s.catches_varargs = macro_mentions_.back().first;
    s.catches_kwargs = macro_mentions_.back().second;
    macro_mentions_.pop_back();
    loop_depth_ = saved_loop_depth;
    SY_TRY(status);
    SY_TRY(finish_tag());
    body.push_back(std::move(s));
    return Status::ok();
  }

  // ---- expressions (jinja2's precedence, lowest first) ----

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool is_tuple_end() const {
    return current().type == TokenType::kVariableEnd || current().type == TokenType::kBlockEnd ||
           is_op(")") || current().type == TokenType::kEnd;
  }

  // Comma-separated expressions become a tuple: `{% set a, b = 1, 2 %}`, `(1, 2)`.
  Result<ExprPtr> parse_tuple(bool with_condexpr, bool explicit_parentheses) {
    int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) SY_TRY(expect_op(","));
      if (is_tuple_end()) break;
      SY_ASSIGN(ExprPtr item, with_condexpr ? parse_expression() : parse_or());
      items.push_back(std::move(item));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (items.size() == 1) return std::move(items[0]);
      if (!explicit_parentheses) return unexpected("an expression");
    }
    auto t = node(Expr::Kind::kTuple, line);
    t->args = std::move(items);
    return t;
  }

  Result<ExprPtr> parse_expression() {
    Nest nest(*this);
    SY_TRY(check_depth());
    SY_ASSIGN(ExprPtr value, parse_or());
    while (is_name("if")) {
      int line = current().line;
      advance();
      SY_ASSIGN(ExprPtr condition, parse_or());
      ExprPtr otherwise;
      if (is_name("else")) {
        advance();
        SY_ASSIGN(otherwise, parse_expression());
      }
      auto c = node(Expr::Kind::kConditional, line);
      c->args.push_back(std::move(value));
      c->args.push_back(std::move(condition));
      c->args.push_back(std::move(otherwise));
      value = std::move(c);
    }
    return value;
  }

  Result<ExprPtr> parse_or() {
    SY_ASSIGN(ExprPtr left, parse_and());
    while (is_name("or")) {
      int line = current().line;
      advance();
      SY_ASSIGN(ExprPtr right, parse_and());
      left = binary(Expr::Kind::kOr, "or", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    SY_ASSIGN(ExprPtr left, parse_not());
    while (is_name("and")) {
      int line = current().line;
      advance();
      SY_ASSIGN(ExprPtr right, parse_not());
      left = binary(Expr::Kind::kAnd, "and", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      SY_TRY(check_depth());
      int line = current().line;
      advance();
      SY_ASSIGN(ExprPtr operand, parse_not());
      auto n = node(Expr::Kind::kNot, line);
      n->args.push_back(std::move(operand));
      return n;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    int line = current().line;
    SY_ASSIGN(ExprPtr first, parse_math1());
    auto compare = node(Expr::Kind::kCompare, line);
    compare->args.push_back(std::move(first));
    while (true) {
      std::string op;
      if (current().type == TokenType::kOperator &&
          (current().value == "==" || current().value == "!=" || current().value == "<" ||
           current().value == "<=" || current().value == ">" || current().value == ">=")) {
        op = current().value;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      SY_ASSIGN(ExprPtr operand, parse_math1());
      compare->ops.push_back(op);
      compare->args.push_back(std::move(operand));
    }
    if (compare->ops.empty()) return std::move(compare->args[0]);
    return compare;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr left, ExprPtr right, int line) {
    auto b = node(kind, line);
    b->name = std::move(op);
    b->args.push_back(std::move(left));
    b->args.push_back(std::move(right));
    return b;
  }

  template <typename Next>
  Result<ExprPtr> parse_binary_level(std::initializer_list<const char*> ops, Next next) {
    SY_ASSIGN(ExprPtr left, (this->*next)());
    while (true) {
      const char* matched = nullptr;
      for (const char* op : ops)
        if (is_op(op)) matched = op;
      if (!matched) break;
      int line = current().line;
      advance();
      SY_ASSIGN(ExprPtr right, (this->*next)());
      left = binary(Expr::Kind::kBinary, matched, std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_math1() { return parse_binary_level({"+", "-"}, &Parser::parse_concat); }
  Result<ExprPtr> parse_concat() { return parse_binary_level({"~"}, &Parser::parse_math2); }
  Result<ExprPtr> parse_math2() {
    return parse_binary_level({"*", "/", "//", "%"}, &Parser::parse_pow);
  }
  Result<ExprPtr> parse_pow() { return parse_binary_level({"**"}, &Parser::parse_unary_filtered); }
  Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    Nest nest(*this);
    SY_TRY(check_depth());
    int line = current().line;
    ExprPtr value;
    if (is_op("-") || is_op("+")) {
      bool negative = is_op("-");
      advance();
      SY_ASSIGN(ExprPtr operand, parse_unary(false));
      value = node(negative ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      value->args.push_back(std::move(operand));
    } else {
      SY_ASSIGN(value, parse_primary());
    }
    SY_ASSIGN(value, parse_postfix(std::move(value)));
    if (with_filter) {
      SY_ASSIGN(value, parse_filter_expr(std::move(value)));
    }
    return value;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = current();
    int line = t.line;
    if (t.type == TokenType::kName) {
      std::string name = t.value;
      advance();
      auto literal = node(Expr::Kind::kLiteral, line);
      if (name == "true" || name == "True") {
        literal->literal = Value::from_bool(true);
        return literal;
      }
      if (name == "false" || name == "False") {
        literal->literal = Value::from_bool(false);
        return literal;
      }
      if (name == "none" || name == "None") {
        literal->literal = Value::none();
        return literal;
      }
      if (!macro_mentions_.empty()) {
        if (name == "varargs") macro_mentions_.back().first = true;
        if (name == "kwargs") macro_mentions_.back().second = true;
      }
      if (name == "caller")
        return Status::errorf("line {}: 'caller' ({{% call %}} blocks) is not supported", line);
      auto n = node(Expr::Kind::kName, line);
      n->name = std::move(name);
      return n;
    }
    if (t.type == TokenType::kString) {
      std::string text;
      while (current().type == TokenType::kString) {
        text += current().value;
        advance();
      }
      auto literal = node(Expr::Kind::kLiteral, line);
      literal->literal = Value::from_string(std::move(text));
      return literal;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      auto literal = node(Expr::Kind::kLiteral, line);
      literal->literal =
          t.type == TokenType::kInteger ? Value::from_int(t.integer) : Value::from_float(t.number);
      advance();
      return literal;
    }
    if (is_op("(")) {
      advance();
      SY_ASSIGN(ExprPtr inner, parse_tuple(true, true));
      SY_TRY(expect_op(")"));
      return inner;
    }
    if (is_op("[")) {
      advance();
      auto list = node(Expr::Kind::kList, line);
      while (!is_op("]")) {
        if (!list->args.empty()) SY_TRY(expect_op(","));
        if (is_op("]")) break;
        SY_ASSIGN(ExprPtr item, parse_expression());
        list->args.push_back(std::move(item));
      }
      advance();
      return list;
    }
    if (is_op("{")) {
      advance();
      auto dict = node(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        if (!dict->args.empty()) SY_TRY(expect_op(","));
        if (is_op("}")) break;
        SY_ASSIGN(ExprPtr key, parse_expression());
        SY_TRY(expect_op(":"));
        SY_ASSIGN(ExprPtr value, parse_expression());
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(value));
      }
      advance();
      return dict;
    }
    return unexpected("an expression");
  }

  Result<ExprPtr> parse_postfix(ExprPtr value) {
    while (true) {
      int line = current().line;
      if (is_op(".")) {
        advance();
        if (current().type == TokenType::kName) {
          auto attr = node(Expr::Kind::kGetAttr, line);
          attr->name = current().value;
          attr->args.push_back(std::move(value));
          advance();
          value = std::move(attr);
        } else if (current().type == TokenType::kInteger) {
          auto item = node(Expr::Kind::kGetItem, line);
          auto index = node(Expr::Kind::kLiteral, line);
          index->literal = Value::from_int(current().integer);
          item->args.push_back(std::move(value));
          item->args.push_back(std::move(index));
          advance();
          value = std::move(item);
        } else {
          return unexpected("an attribute name after '.'");
        }
      } else if (is_op("[")) {
        advance();
        SY_ASSIGN(value, parse_subscript(std::move(value), line));
      } else if (is_op("(")) {
        SY_ASSIGN(value, parse_call(std::move(value), Expr::Kind::kCall, ""));
      } else {
        return value;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr value, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (is_op(":")) {
        is_slice = true;
        if (++part > 2) return unexpected("']'");
        advance();
        continue;
      }
      if (is_op("]")) break;
      if (parts[part]) return unexpected("':' or ']'");
      SY_ASSIGN(parts[part], parse_expression());
      if (is_op(","))
        return Status::errorf("line {}: tuple subscripts (x[a, b]) are not supported", line);
    }
    advance();  // ]
    if (!is_slice) {
      if (!parts[0]) return Status::errorf("line {}: empty subscript '[]'", line);
      auto item = node(Expr::Kind::kGetItem, line);
      item->args.push_back(std::move(value));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = node(Expr::Kind::kSlice, line);
    slice->args.push_back(std::move(value));
    for (auto& p : parts) slice->args.push_back(std::move(p));
    return slice;
  }

  // `callee(args)` for calls, or `value | name(args)` / `value is name(args)` when kind says so.
  Result<ExprPtr> parse_call(ExprPtr subject, Expr::Kind kind, std::string name) {
    auto call = node(kind, current().line);
    call->name = std::move(name);
    call->args.push_back(std::move(subject));
    if (!is_op("(")) return call;
    advance();
    bool first = true;
    while (!is_op(")")) {
      if (!first) SY_TRY(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        return Status::errorf("line {}: '*args' / '**kwargs' in calls are not supported",
                              current().line);
      if (current().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = current().value;
        advance();
        advance();
        SY_ASSIGN(ExprPtr value, parse_expression());
        call->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call->kwargs.empty())
          return Status::errorf("line {}: a positional argument follows a keyword argument",
                                current().line);
        SY_ASSIGN(ExprPtr value, parse_expression());
        call->args.push_back(std::move(value));
      }
    }
    advance();  // )
    return call;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr value) {
    while (true) {
      if (is_op("|")) {
        int line = current().line;
        advance();
        SY_ASSIGN(std::string name, expect_name());
        if (!is_known_filter(name))
          return Status::errorf("line {}: unknown filter '{}'", line, name);
        SY_ASSIGN(value, parse_call(std::move(value), Expr::Kind::kFilter, name));
      } else if (is_name("is")) {
        int line = current().line;
        advance();
        bool negated = false;
        if (is_name("not")) {
          negated = true;
          advance();
        }
        SY_ASSIGN(std::string name, expect_name());
        if (!is_known_test(name)) return Status::errorf("line {}: unknown test '{}'", line, name);
        ExprPtr test;
        if (is_op("(")) {
          SY_ASSIGN(test, parse_call(std::move(value), Expr::Kind::kTest, name));
        } else {
          test = node(Expr::Kind::kTest, line);
          test->name = name;
          test->args.push_back(std::move(value));
          const Token& t = current();
          bool takes_argument = (t.type == TokenType::kName || t.type == TokenType::kString ||
                                 t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
                                 is_op("[") || is_op("{")) &&
                                !is_name("else") && !is_name("or") && !is_name("and");
          if (takes_argument) {
            if (is_name("is"))
              return Status::errorf("line {}: tests cannot be chained with 'is'", line);
            SY_ASSIGN(ExprPtr argument, parse_primary());
            SY_ASSIGN(argument, parse_postfix(std::move(argument)));
            test->args.push_back(std::move(argument));
          }
        }
        test->negated = negated;
        value = std::move(test);
      } else if (is_op("(")) {
        SY_ASSIGN(value, parse_call(std::move(value), Expr::Kind::kCall, ""));
      } else {
        return value;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::pair<bool, bool>> macro_mentions_;  // (varargs, kwargs) per macro being parsed
};

}  // namespace

Result<Body> parse(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace sy::chat
