// The engine's exception hierarchy; the bindings mirror it as Python exception classes.
#pragma once

#include <stdexcept>

namespace llm_serving {

// A constraint, catalog or argument is invalid (maps to Python's ValueError).
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The engine was used in a way its current state does not allow (maps to RuntimeError).
class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace llm_serving
