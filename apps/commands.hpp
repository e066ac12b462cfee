#pragma once
// Each `cocodiff` sub-command lives in its own apps/cmd_*.cpp and registers itself here.

#include <CLI/CLI.hpp>

namespace cocodiff::apps {}  // namespace cocodiff::apps
