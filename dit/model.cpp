#include "dit/model.hpp"

#include "dit/model_family.hpp"

namespace cocodiff::dit {

std::unique_ptr<Model> make_model(const ModelConfig& cfg) {
  return model_family(cfg.family).make(cfg);
}

}  // namespace cocodiff::dit
