#include "dit/parallel/search.hpp"

namespace cocodiff::dit {

int SearchShape::spanned_levels(int group) const {
  int spanned = 0, prod = 1;
  for (int s : levels) {
    if (prod >= group) break;
    if (s > 1) ++spanned;
    prod *= s;
  }
  return spanned;
}

std::vector<bool> SearchShape::text_options(int degree) const {
  std::vector<bool> t = {false};
  if (has_text && degree > 1 && model->text_tokens % degree == 0) t.push_back(true);
  return t;
}

}  // namespace cocodiff::dit
