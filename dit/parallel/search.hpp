#pragma once
// What a strategy offers `cocodiff tune`: the points of its search space on one cluster shape.
// Each built-in search is written beside its strategy (ulysses_search in sp_attention.cpp,
// usp_search in usp.cpp, pipefusion_search in pipefusion.cpp), listed once in the strategy table
// (strategies.cpp); a program adds its own strategy's search with StrategyRegistry::add_search.
// tune runs every search and names no strategy.
//
//   void my_search(const SearchShape& s, const SearchEmit& emit) {
//     SearchPoint p;
//     p.strategy = "kv_gather";  // run.strategy
//     p.ulysses = s.ranks;       // every rank one sequence-parallel group
//     p.uneven_heads = s.model->heads % s.ranks != 0;
//     emit(p);
//   }

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"

namespace cocodiff::dit {

struct RunSettings;  // dit/pipeline.hpp

/// What `cocodiff tune --lossy` measures of a lossy strategy before the search: real-math runs
/// of `strategy` on the trained model with `key` at each of `levels`, against its run at
/// `exact`, by the preview's PSNR, and the share of its exchange each level still sent. The
/// admitted levels reach the searches (SearchShape::lossy); the words name them in tables.
struct LossyProbe {
  std::string strategy;        // run.strategy of the measured runs ("cocodiff")
  std::string key;             // the setting measured ("v_major.threshold")
  std::string name;            // the mechanism, in tables ("V-Major")
  std::string setting;         // the setting, in tables ("threshold")
  double exact = 0;            // the value at which the strategy is exact
  std::vector<double> levels;  // the values measured, in order
  std::string sent;            // what the share counts, in tables ("V blocks")
  std::string sent_key;        // its tune.json name ("v_blocks_sent")
  std::string phantom_key;     // the setting a phantom run sends that share by
  /// The share a run sent, from its merged StrategyStats (1: all of it).
  std::function<double(const StrategyStats&)> sent_fraction;
};

/// A lossy setting measured on the trained model before the search (tune's --lossy), with what
/// a point running it sets: the probe's key, its value, and the share of the exchange it sent.
struct SearchLossy {
  std::string key;  // LossyProbe::key
  double threshold = 0;
  double active_fraction = 0;
};

/// One cluster shape of the search: the run as the config resolves it, and the shape's ranks.
struct SearchShape {
  const ModelConfig* model = nullptr;
  const RunSettings* settings = nullptr;
  int ranks = 1;                   // every tile of the shape
  int nodes = 1;                   // of them
  std::vector<int> levels;         // the topology's level sizes, innermost first, nodes last
  bool cfg_capable = false;        // the model has an unconditional pass CFG-parallel can split
  bool has_text = false;           // joint text tokens that text sharding can split
  std::vector<SearchLossy> lossy;  // admitted lossy settings (empty without --lossy)

  /// How many of the levels a group of ranks [0, group) spans with more than one member,
  /// counted from the innermost: a hierarchical exchange differs from a flat one over two or
  /// more.
  int spanned_levels(int group) const;
  /// Text sharding over a group of `degree` ranks: off, and on where the text splits evenly.
  std::vector<bool> text_options(int degree) const;
};

/// One point a search offers. tune sets run.strategy and the parallel degrees, then `sets`,
/// then ulysses.uneven_heads and parallel.shard_text from the fields below.
struct SearchPoint {
  std::string strategy;  // run.strategy
  int ulysses = 1, ring = 1, cfg = 1;
  int chunks = 0;  // pipelined chunks of a layer's exchange (0: none), as tables report it
  bool shard_text = false, uneven_heads = false;
  std::vector<std::string> sets;  // the strategy's own --set keys, in order
  std::string detail;             // what tables print after the name ("4x2, tapa" -> " 4x2, tapa")
  int wave = 2;                   // which run first: 0 (likely fastest), 1, 2
  bool baseline = false;          // the shape's baseline (flat Ulysses): always timed to the end
  int lossy = -1;                 // index of SearchShape::lossy it runs (-1: exact)
  std::vector<std::pair<std::string, std::int64_t>> report;  // its own tune.json integers
};

using SearchEmit = std::function<void(SearchPoint)>;
/// Every point of a strategy's search space on one shape, through `emit`.
using StrategySearch = std::function<void(const SearchShape& shape, const SearchEmit& emit)>;

/// A search with the name tables give it.
struct NamedSearch {
  std::string name;
  StrategySearch search;
};

}  // namespace cocodiff::dit
