// V-Major's premise, measured: how much V (the image tokens' value projection) changes between
// adjacent denoising steps, per attention layer, for the trained flux1-fmnist weights and for
// seeded random weights of the same model. Serial runs (one rank): the numbers are properties
// of the model, not of the strategy.
//   v_similarity [--steps 20] [--seeds 8] [--out DIR]   -> DIR/v_similarity.{csv,json}
// Each row: weights, layer, block (double- or single-stream, and its index among its kind), the
// mean over seeds and steps 1..N-1 of ||V_t - V_{t-1}|| / ||V_{t-1}||, and its min and max over
// the steps (each step's value is the mean over seeds), and the steps where those occur. The JSON
// has the same rows and the settings in "meta" (bench/README.md's table is rendered from it).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"
#include "dit/local_comm.hpp"
#include "dit/pipeline.hpp"

namespace {

using namespace cocodiff;

// Serial attention that records each layer's image-stream V and its change since the last step.
class Recorder final : public dit::AttentionStrategy {
 public:
  explicit Recorder(std::map<int, std::vector<std::vector<double>>>* change) : change_(change) {}
  std::string name() const override { return "v_recorder"; }
  int degree() const override { return 1; }
  int index() const override { return 0; }
  void begin_forward(int step, int /*pass*/) override {
    layer_ = 0;
    step_ = step;
  }
  std::vector<Tensor> attend(const dit::Exec& ex, const dit::QkvSource& src,
                             const dit::AttentionShape& shape) override {
    for (int s = 0; s < src.num_streams(); ++s) {
      if (!src.sharded(s)) continue;  // image tokens only (text V is constant per class)
      const Tensor v = src.project(ex, s, dit::QkvPart::kV, 0, shape.heads);
      auto it = prev_.find(layer_);
      if (it != prev_.end()) {
        const double d = (v.mat() - it->second.mat()).norm();
        const double n = it->second.mat().norm();
        std::vector<std::vector<double>>& per_step = (*change_)[layer_];
        if (per_step.size() < static_cast<size_t>(step_))
          per_step.resize(static_cast<size_t>(step_));
        per_step[static_cast<size_t>(step_ - 1)].push_back(n > 0 ? d / n : 0.0);
      }
      prev_[layer_] = v;
    }
    ++layer_;
    return inner_.attend(ex, src, shape);
  }

 private:
  std::map<int, std::vector<std::vector<double>>>* change_;
  std::map<int, Tensor> prev_;
  dit::SerialAttention inner_;
  int layer_ = 0;
  int step_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 20, seeds = 8;
  std::filesystem::path out = "bench-out";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::stoi(argv[i + 1]);
    if (a == "--seeds") seeds = std::stoi(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  const std::filesystem::path configs = COCODIFF_CONFIG_DIR;
  const dit::ModelConfig mc = dit::load_model_preset("flux1-fmnist", configs / "models");
  const auto trained =
      dit::load_weights(mc, configs / "weights" / "flux1-fmnist" / "flux1-fmnist.safetensors");
  const auto random = dit::make_weights(mc, 0, false);
  std::filesystem::create_directories(out);
  std::ofstream csv(out / "v_similarity.csv");
  csv << "weights,layer,block,mean_relative_change,min_step_change,max_step_change,steps,seeds\n";
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-8s %6s %10s %20s %10s %10s\n", "weights", "layer", "block", "mean ||dV||/||V||",
              "min step", "max step");
  for (const auto& [label, w] : {std::pair{"trained", trained}, std::pair{"random", random}}) {
    // change[layer][step - 1]: one value per seed
    std::map<int, std::vector<std::vector<double>>> change;
    for (int seed = 0; seed < seeds; ++seed) {
      dit::LocalComm comm;
      dit::RunSettings st;
      st.resolution = 28;
      st.steps = steps;
      st.seed = static_cast<std::uint64_t>(seed);
      st.class_label = seed % mc.num_classes;
      st.make_strategy = [&change](Communicator&, const dit::ModelConfig&) {
        return std::make_unique<Recorder>(&change);
      };
      dit::generate(comm, mc, *w, st);
    }
    for (const auto& [layer, per_step] : change) {
      double sum = 0, lo = 1e300, hi = 0;
      int lo_step = 0, hi_step = 0;  // the step t of V_t - V_{t-1}
      std::size_t count = 0;
      for (size_t i = 0; i < per_step.size(); ++i) {
        const std::vector<double>& v = per_step[i];
        double step_sum = 0;
        for (double x : v) step_sum += x;
        sum += step_sum;
        count += v.size();
        const double step_mean = step_sum / static_cast<double>(v.size());
        if (step_mean < lo) {
          lo = step_mean;
          lo_step = static_cast<int>(i) + 1;
        }
        if (step_mean > hi) {
          hi = step_mean;
          hi_step = static_cast<int>(i) + 1;
        }
      }
      const double mean = sum / static_cast<double>(count);
      const std::string block = layer < mc.double_blocks
                                    ? "double " + std::to_string(layer)
                                    : "single " + std::to_string(layer - mc.double_blocks);
      std::printf("%-8s %6d %10s %20.4f %10.4f %10.4f\n", label, layer, block.c_str(), mean, lo,
                  hi);
      csv << label << "," << layer << "," << block << "," << mean << "," << lo << "," << hi << ","
          << steps << "," << seeds << "\n";
      rows.push_back({{"weights", label},
                      {"layer", layer},
                      {"block", block},
                      {"mean_relative_change", mean},
                      {"min_step_change", lo},
                      {"min_step", lo_step},
                      {"max_step_change", hi},
                      {"max_step", hi_step}});
    }
  }
  const nlohmann::json j = {
      {"benchmark", "v_similarity"},
      {"meta",
       {{"model", "flux1-fmnist"},
        {"double_blocks", mc.double_blocks},
        {"single_blocks", mc.single_blocks},
        {"resolution", 28},
        {"cfg_scale", mc.cfg_scale},
        {"steps", steps},
        {"seeds", seeds},
        {"random_weights_seed", 0},
        {"measure",
         "||V_t - V_{t-1}|| / ||V_{t-1}|| of the image tokens' V per attention layer, serial; "
         "mean over seeds and steps 1..steps-1, min and max over the steps of the per-step mean "
         "over seeds, and the steps where they occur"}}},
      {"rows", rows}};
  cocodiff::bench::write_text(out / "v_similarity.json", j.dump(2) + "\n");
  return 0;
}
