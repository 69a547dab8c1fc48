// The filters, tests, methods and global functions templates may call, each behaving as jinja2's
// (or Python's, for methods) does under transformers' settings.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "chat/renderer.h"

namespace sy::chat {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
Result<Value> apply_filter(Renderer& renderer, const std::string& name, const Value& input,
                           CallArgs& args);
Result<bool> apply_test(Renderer& renderer, const std::string& name, const Value& value,
                        CallArgs& args);
// A bound method of a str / dict / list value; nullopt when the type has no attribute `name`.
std::optional<Value> find_method(const Value& object, const std::string& name);
// range, namespace, dict, raise_exception (transformers), strftime_now (transformers).
void add_globals(Scope& scope);

}  // namespace sy::chat
