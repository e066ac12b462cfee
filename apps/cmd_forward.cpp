// `cocodiff forward --model PRESET --weights W.safetensors --input IN.safetensors
//                   --output OUT.safetensors`
// One transformer pass on given inputs, serially, for conformance checks against other
// frameworks (PyTorch/diffusers). Tensors of IN (fp32, fp16 or bf16); README.md, "One
// transformer pass", lists them per model. A tensor the model does not take is refused.
//   latent       [C, H, W]  the latent at latent resolution (C = the model's latent channels)
//   sigma        [1]        noise level in [0, 1] (the model sees sigma * timestep_scale)
//   text         [T, D]     text embeddings (SD3, FLUX, Qwen-Image), T = model.text_tokens
//   pooled       [1, P]     pooled text embedding (SD3, FLUX), required when P > 0
//   guidance     [1]        FLUX.1-dev distilled guidance, optional (default: the preset's)
//   class_label  [1]        a class of a class-conditional model: DiT (default 0), or a FLUX
//                           model with learned class tokens (flux1-fmnist), where it replaces
//                           text and pooled (the class's tokens); refused by other models
// OUT holds `velocity` [C_out, H, W], the model's prediction, in fp32.

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "apps/commands.hpp"
#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/local_comm.hpp"
#include "dit/model.hpp"
#include "dit/model_family.hpp"
#include "dit/pipeline.hpp"
#include "dit/safetensors.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

struct ForwardOptions {
  std::string model;
  std::string weights;
  std::string input;
  std::string output;
  std::vector<std::string> sets;
};

float scalar(const dit::SafetensorsFile& f, const std::string& name, float def) {
  if (f.find(name) == nullptr) return def;
  Tensor t = f.read(name);
  if (t.numel() != 1)
    throw InputError(f.path().string() + ": tensor '" + name + "' must hold one value, has " +
                     std::to_string(t.numel()));
  return t.mat()(0, 0);
}

Tensor required(const dit::SafetensorsFile& f, const std::string& name, std::int64_t rows,
                std::int64_t cols) {
  if (f.find(name) == nullptr)
    throw InputError(f.path().string() + ": missing input tensor '" + name + "'");
  Tensor t = f.read(name);
  if (t.rows() != rows || t.cols() != cols)
    throw InputError(f.path().string() + ": tensor '" + name + "' is " + t.shape_str() +
                     ", expected [" + std::to_string(rows) + " x " + std::to_string(cols) + "]");
  return t;
}

/// The model preset, with --set model.* overrides, resolved like a run config's [model].
dit::ModelConfig load_model(const ForwardOptions& o) {
  Config cfg = Config::parse("[model]\npreset = \"" + o.model + "\"\n", "--model");
  for (const std::string& s : o.sets) cfg.set(s);
  dit::ModelConfig mc = dit::load_model_config(cfg, config_dir() / "models");
  cfg.check_no_unknown_keys();
  return mc;
}

/// Refuses a tensor of IN the model does not take, and class_label beside text or pooled.
void check_input_names(const dit::SafetensorsFile& in, const dit::ModelConfig& mc,
                       const std::string& input, bool class_tokens) {
  // Every tensor of IN must be one the model takes: a silently ignored input is a wrong result.
  std::vector<std::string> takes = {"latent", "sigma"};
  if (mc.text_tokens > 0) takes.push_back("text");
  if (mc.pooled_dim > 0) takes.push_back("pooled");
  if (mc.guidance_embed) takes.push_back("guidance");
  if (mc.num_classes > 0) takes.push_back("class_label");
  std::string took;
  for (const std::string& t : takes) {
    if (!took.empty()) took += ", ";
    took += t;
  }
  for (const auto& [name, entry] : in.entries())
    if (std::find(takes.begin(), takes.end(), name) == takes.end()) {
      std::string msg = input;
      msg.append(": tensor '").append(name).append("' is not an input of ").append(mc.name);
      msg.append(" (it takes ").append(took).append("; README.md, \"One transformer pass\")");
      throw InputError(msg);
    }
  if (class_tokens && in.find("class_label") != nullptr &&
      (in.find("text") != nullptr || in.find("pooled") != nullptr))
    throw InputError(input + ": give " + mc.name +
                     " either class_label (its learned class tokens) or text and pooled, not both");
}

/// IN's latent as patch tokens, with its frames, height and width (in latent cells).
struct Latent {
  Tensor tokens;
  int frames = 1, h = 0, wd = 0;
};

/// IN's latent, checked against the model (channels, frames, patch size) and patchified.
Latent read_latent(const dit::SafetensorsFile& in, const dit::ModelConfig& mc,
                   const std::string& input) {
  const dit::SafetensorsEntry* le = in.find("latent");
  if (le == nullptr) throw InputError(input + ": missing input tensor 'latent' [C, H, W]");
  // A video model's latent may have frames: [C, F, H, W].
  const bool video = dit::model_family(mc.family).video;
  const std::string shape_text = video ? ", H, W] or [C, F, H, W]" : ", H, W]";
  if ((le->shape.size() != 3 && !(video && le->shape.size() == 4)) ||
      le->shape[0] != mc.latent_channels)
    throw InputError(input + ": 'latent' must be [" + std::to_string(mc.latent_channels) +
                     shape_text);
  const Tensor latent = in.read("latent");  // its shape checked against its data
  const std::size_t hd_at = le->shape.size() - 2;
  if (le->shape[hd_at] > (1 << 20) || le->shape[hd_at + 1] > (1 << 20) ||
      (hd_at == 2 && le->shape[1] > (1 << 16)))
    throw InputError(input + ": 'latent' H and W must be at most 1048576, F at most 65536");
  Latent l;
  l.frames = hd_at == 2 ? static_cast<int>(le->shape[1]) : 1;
  l.h = static_cast<int>(le->shape[hd_at]);
  l.wd = static_cast<int>(le->shape[hd_at + 1]);
  if (l.h % mc.patch_size != 0 || l.wd % mc.patch_size != 0 || l.frames < 1)
    throw InputError(input + ": latent H and W must be multiples of the patch size " +
                     std::to_string(mc.patch_size));
  l.tokens = dit::patchify(latent, mc.latent_channels, l.h, l.wd, mc.patch_size, l.frames);
  return l;
}

/// IN's class label, checked (0 where IN has none or the model has no classes).
int read_class_label(const dit::SafetensorsFile& in, const dit::ModelConfig& mc,
                     const std::string& input) {
  // A class label of a class-conditional model: an index into its class embedding table,
  // num_classes rows then the null class.
  if (mc.num_classes <= 0) return 0;
  const float v = scalar(in, "class_label", 0);
  if (!(v >= 0 && v <= static_cast<float>(mc.num_classes)) || v != std::floor(v)) {
    std::ostringstream found;
    found << v;
    throw InputError(input + ": tensor 'class_label' must be a class index, an integer in [0, " +
                     std::to_string(mc.num_classes - 1) + "] or " + std::to_string(mc.num_classes) +
                     " (the null class) for " + mc.name + "; found " + found.str());
  }
  return static_cast<int>(v);
}

/// The text conditioning: the class's learned tokens, or IN's text and pooled tensors.
void read_conditioning(const dit::SafetensorsFile& in, const dit::ModelConfig& mc,
                       const dit::Weights& w, int label, bool class_tokens,
                       std::optional<Tensor>& text, std::optional<Tensor>& pooled) {
  if (class_tokens && in.find("class_label") != nullptr) {
    // The class's learned tokens stand in for the text encoder's output, as in `run`.
    dit::TextConditioning c = dit::class_conditioning(mc, w, label, false);
    text = std::move(c.text);
    if (mc.pooled_dim > 0) pooled = std::move(c.pooled);
  } else {
    if (mc.text_tokens > 0) text = required(in, "text", mc.text_tokens, mc.text_dim);
    if (mc.pooled_dim > 0) pooled = required(in, "pooled", 1, mc.pooled_dim);
  }
}

/// Runs the pass on `fi`, writes OUT (velocity and output) and prints what it did.
void write_prediction(const ForwardOptions& o, const dit::ModelConfig& mc, const dit::Weights& w,
                      const dit::ForwardInputs& fi, const Latent& l) {
  const int frames = l.frames, h = l.h, wd = l.wd;
  dit::LocalComm comm;
  const Tensor out = dit::forward(comm, mc, w, "serial", fi, /*phantom=*/false);
  const int out_channels = static_cast<int>(out.cols()) / (mc.patch_size * mc.patch_size);
  const Tensor all = dit::unpatchify(out, out_channels, h, wd, mc.patch_size, frames);
  // "output": every predicted channel; "velocity": the latent channels the sampler steps with
  // (the first latent_channels of "output"; the two are equal unless the model predicts more).
  Tensor velocity = Tensor::from(all.mat().topRows(mc.latent_channels));
  auto shape = [&](std::int64_t c) {
    return frames > 1 ? std::vector<std::int64_t>{c, frames, h, wd}
                      : std::vector<std::int64_t>{c, h, wd};
  };
  dit::write_safetensors(o.output, {{"velocity", shape(mc.latent_channels), &velocity},
                                    {"output", shape(out_channels), &all}});
  const std::string dims = (frames > 1 ? std::to_string(frames) + ", " : std::string()) +
                           std::to_string(h) + ", " + std::to_string(wd);
  std::cout << "forward " << mc.name << ": latent [" << mc.latent_channels << ", " << dims
            << "], sigma " << fi.sigmas[0] << " -> " << o.output << " (output [" << out_channels
            << ", " << dims << "], velocity = its first " << mc.latent_channels << " channels, "
            << comm.flops() / 1e9 << " GFLOP)\n";
}

void run_forward(const ForwardOptions& o) {
  const dit::ModelConfig mc = load_model(o);
  std::shared_ptr<const dit::Weights> w = dit::load_weights(mc, o.weights);

  dit::SafetensorsFile in(o.input);
  const bool class_tokens = dit::model_family(mc.family).class_tokens && mc.num_classes > 0;
  check_input_names(in, mc, o.input, class_tokens);
  const Latent l = read_latent(in, mc, o.input);
  const int label = read_class_label(in, mc, o.input);
  std::optional<Tensor> text, pooled;
  read_conditioning(in, mc, *w, label, class_tokens, text, pooled);

  dit::ForwardInputs fi;
  fi.batch = 1;
  fi.x = &l.tokens;
  fi.grid = {l.frames, l.h / mc.patch_size, l.wd / mc.patch_size};
  fi.shard = dit::shard_tokens(l.tokens.rows(), 1, 0);
  fi.sigmas = {scalar(in, "sigma", -1)};
  if (fi.sigmas[0] < 0 || fi.sigmas[0] > 1)
    throw InputError(o.input + ": tensor 'sigma' [1] in [0, 1] is required");
  if (mc.guidance_embed) fi.guidance = {scalar(in, "guidance", static_cast<float>(mc.cfg_scale))};
  if (text) fi.text = &*text;
  if (pooled) fi.pooled = &*pooled;
  if (mc.num_classes > 0) fi.class_labels = {label};

  fi.all_channels = true;  // DiT's learned-sigma channels too
  write_prediction(o, mc, *w, fi, l);
}

}  // namespace

void add_forward_command(CLI::App& app) {
  auto o = std::make_shared<ForwardOptions>();
  CLI::App* cmd =
      app.add_subcommand("forward", "One transformer pass on given inputs (conformance checks)");
  cmd->add_option("--model", o->model, "Model preset (configs/models/NAME.toml)")->required();
  cmd->add_option("--weights", o->weights, "Checkpoint (safetensors, upstream names)")->required();
  cmd->add_option("--input", o->input, "Inputs: latent, sigma, text, pooled, guidance, class_label")
      ->required();
  cmd->add_option(
         "--output", o->output,
         "Output safetensors: output (every predicted channel), velocity (the latent channels)")
      ->required();
  cmd->add_option("--set", o->sets, "Override a model key: --set model.double_blocks=2");
  cmd->callback([o] { run_forward(*o); });
}

}  // namespace cocodiff::apps
