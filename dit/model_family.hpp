#pragma once
// The one list of model families: every name `model.family` accepts, what a family's config
// defaults to and must satisfy, and the model it builds. The built-ins (dit/models/, one file
// each) are registered exactly as a user's own family is: a new family is its model's file, one
// register_model_family() call and its preset under configs/models/.
//
//   ModelFamily f;
//   f.name = "my-dit";
//   f.summary = "joint blocks with a learned position table";
//   f.make = [](const ModelConfig& cfg) { return std::make_unique<MyDit>(cfg); };
//   register_model_family(std::move(f));   // `[model] family = "my-dit"` now builds it
//
// Registration happens before configs are read (it takes a lock; so do lookups).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dit/model_config.hpp"

namespace cocodiff::dit {

class Model;

/// What is wrong with a model config, as a family's check reports it: the key under [model]
/// to blame, what it should be and what it is, and the key whose line the error points at
/// (empty: `key`).
struct ModelConfigProblem {
  ModelConfigProblem(std::string key_, std::string expected_, std::string found_,
                     std::string at_ = {})
      : key(std::move(key_)),
        expected(std::move(expected_)),
        found(std::move(found_)),
        at(std::move(at_)) {}
  std::string key, expected, found, at;
};

struct ModelFamily {
  std::string name;     // as `model.family` spells it
  std::string summary;  // one line, for the docs and errors
  /// Conditioned on text (a text stream beside the image tokens in attention). False: on a
  /// class label only (DiT), which needs model.num_classes >= 1 and has no text to shard.
  bool text_conditioned = true;
  /// num_classes > 0 means learned class tokens in place of the text embeddings.
  bool class_tokens = false;
  /// Blocks may add SD3.5 Medium's second, image-only attention (model.dual_attention_blocks).
  bool dual_attention = false;
  /// Its models take several frames (run.frames > 1): their positions know the frame.
  bool video = false;
  /// The text is a stream of the image's attention (joint attention), which a strategy may
  /// shard (parallel.shard_text). False: the text enters another way (Wan's cross-attention).
  bool joint_text = true;
  /// Defaults where a config is silent.
  int default_text_tokens = 512;
  int default_pooled_dim = 0;
  int default_num_classes = 0;
  bool default_qk_norm = true;
  /// TeaCache's published rescale polynomial for the family (dit/step_cache.hpp), highest power
  /// first; empty: none published here (the raw change is accumulated).
  std::vector<double> teacache_coefficients;
  /// The transformer blocks a forward runs in order, for families whose forward honours
  /// ForwardInputs::stage (a pipeline stage's share of them: PipeFusion); null: it does not.
  std::function<int(const ModelConfig&)> stage_blocks;
  /// Checks of several keys together, after the shared ones; nullopt: nothing wrong.
  std::function<std::optional<ModelConfigProblem>(const ModelConfig&)> check;
  /// The model for `cfg` (cfg.family is this family's name).
  std::function<std::unique_ptr<Model>(const ModelConfig& cfg)> make;
};

/// The problem of a config whose model.rope_axes does not hold `axes` widths (`names`: what
/// they rotate, for the message), for a family's check; nullopt when it does.
std::optional<ModelConfigProblem> rope_axes_problem(const ModelConfig& m, std::size_t axes,
                                                    std::string_view names);

/// Adds `f`; throws ConfigError when its name is taken or it has no `make`.
void register_model_family(ModelFamily f);

/// The family called `name`; null when there is none.
const ModelFamily* find_model_family(std::string_view name);

/// The family called `name`; throws ConfigError naming the registered ones when there is none.
const ModelFamily& model_family(std::string_view name);

/// The registered names, in registration order.
std::vector<std::string> model_family_names();

}  // namespace cocodiff::dit
