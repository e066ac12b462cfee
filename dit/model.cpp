#include "dit/model.hpp"

namespace cocodiff::dit {

std::unique_ptr<Model> make_model(const ModelConfig& cfg) {
  switch (cfg.family) {
    case Family::kDiT:
      return make_dit_xl(cfg);
    case Family::kSD3:
      return make_sd3(cfg);
    case Family::kFlux:
      return make_flux(cfg);
    case Family::kFlux2:
      return make_flux2(cfg);
    case Family::kQwenImage:
      return make_qwen_image(cfg);
  }
  return nullptr;
}

}  // namespace cocodiff::dit
