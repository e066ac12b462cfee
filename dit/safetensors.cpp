#include "dit/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"

namespace cocodiff::dit {

namespace {

constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;  // upstream's own limit

std::size_t dtype_bytes(StDtype d) { return d == StDtype::kF32 ? 4 : 2; }

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F;
  std::uint32_t man = h & 0x3FF;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3FF;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<std::uint16_t>(bits >> 16);
}

[[noreturn]] void bad(const std::filesystem::path& p, const std::string& what) {
  throw InputError(p.string() + ": " + what);
}

/// The format's layout rule: the tensors' byte ranges, in offset order, tile the data region
/// exactly, from 0 to its end, with no gap and no overlap.
void check_tiling(const std::filesystem::path& p,
                  const std::map<std::string, SafetensorsEntry>& entries, std::uint64_t data_size) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
  by_offset.reserve(entries.size());
  for (const auto& [name, e] : entries) by_offset.emplace_back(&name, &e);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  std::uint64_t next = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, e] : by_offset) {
    if (e->begin < next)
      bad(p, "tensor '" + *name + "': data_offsets [" + std::to_string(e->begin) + ", " +
                 std::to_string(e->end) + ") overlap tensor '" + *prev + "' (which ends at " +
                 std::to_string(next) + ")");
    if (e->begin > next)
      bad(p, "tensor '" + *name + "': data_offsets [" + std::to_string(e->begin) + ", " +
                 std::to_string(e->end) + ") leave a gap of " + std::to_string(e->begin - next) +
                 " bytes before them (the tensors must tile the data section)");
    next = e->end;
    prev = name;
  }
  if (next != data_size)
    bad(p, "the tensors cover " + std::to_string(next) + " bytes of the " +
               std::to_string(data_size) + "-byte data section (trailing bytes or truncated)");
}

}  // namespace

std::string st_dtype_name(StDtype d) {
  switch (d) {
    case StDtype::kF32:
      return "F32";
    case StDtype::kF16:
      return "F16";
    case StDtype::kBF16:
      return "BF16";
  }
  return "?";
}

namespace {

// Every input is a regular file before it is opened: a FIFO or a device would block or never end.
void require_regular_file(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) bad(path, "cannot read " + what + " (no such file)");
  if (!std::filesystem::is_regular_file(st))
    bad(path, "not a regular file (" + what + " is expected)");
}

// The header's DOM, built in one pass (linear in its size), noting the first tensor name that
// appears twice (a JSON object would keep the last). A parser callback would do the same in
// quadratic time: at every object's end it scans the parent for discarded values.
struct HeaderSax : nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  explicit HeaderSax(nlohmann::json& root) : Base(root) {}
  bool start_object(std::size_t n) {
    ++depth;
    return Base::start_object(n);
  }
  bool end_object() {
    --depth;
    return Base::end_object();
  }
  bool key(nlohmann::json::string_t& k) {
    if (depth == 1 && duplicate.empty() && !seen.insert(k).second) duplicate = k;
    return Base::key(k);
  }
  int depth = 0;
  std::unordered_set<std::string> seen;
  std::string duplicate;
};

// The checkpoint's JSON header text, and where its data section starts and how long it is.
struct HeaderText {
  std::string json;
  std::uint64_t data_start = 0;
  std::uint64_t data_size = 0;
};

// Reads the length field and the header it announces, checked against the file's size.
HeaderText read_header_text(const std::filesystem::path& path) {
  require_regular_file(path, "a safetensors checkpoint");
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (ec) bad(path, "cannot read checkpoint (" + ec.message() + ")");
  if (file_size < 8) bad(path, "truncated: " + std::to_string(file_size) + " bytes, no header");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open checkpoint");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    bad(path, "header claims " + std::to_string(header_len) + " bytes but the file has " +
                  std::to_string(file_size - 8) +
                  " after the length field (truncated or not a "
                  "safetensors file)");
  HeaderText h;
  h.json.assign(header_len, '\0');
  in.read(h.json.data(), static_cast<std::streamsize>(header_len));
  if (!in) bad(path, "truncated header");
  h.data_start = 8 + header_len;
  h.data_size = file_size - h.data_start;
  return h;
}

// Parses the header: a JSON object whose tensor names are unique.
nlohmann::json parse_header(const std::filesystem::path& path, const std::string& header) {
  nlohmann::json j;
  HeaderSax sax(j);
  try {
    nlohmann::json::sax_parse(header, &sax);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "header is not a JSON object");
  const std::string& duplicate = sax.duplicate;
  if (!duplicate.empty())
    bad(path, "tensor '" + duplicate + "' is listed twice in the header (names must be unique)");
  return j;
}

// One tensor's header entry `e`, checked against itself and the `data_size`-byte data section.
SafetensorsEntry parse_entry(const std::filesystem::path& path, const std::string& name,
                             const nlohmann::json& e, std::uint64_t data_size) {
  const std::string where = "tensor '" + name + "': ";
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    bad(path, where + "expected {dtype, shape, data_offsets}");
  SafetensorsEntry en;
  if (!e["dtype"].is_string()) bad(path, where + "dtype is not a string");
  const std::string dt = e["dtype"].get<std::string>();
  if (dt == "F32")
    en.dtype = StDtype::kF32;
  else if (dt == "F16")
    en.dtype = StDtype::kF16;
  else if (dt == "BF16")
    en.dtype = StDtype::kBF16;
  else
    bad(path, where + "unsupported dtype " + dt + " (expected F32, F16 or BF16)");
  if (!e["shape"].is_array()) bad(path, where + "shape is not an array");
  std::uint64_t numel = 1;
  for (const nlohmann::json& d : e["shape"]) {
    if (!d.is_number_unsigned()) bad(path, where + "shape entries must be non-negative integers");
    const std::uint64_t v = d.get<std::uint64_t>();
    if (v != 0 && numel > data_size / v) bad(path, where + "shape larger than the file");
    numel *= v;
    en.shape.push_back(static_cast<std::int64_t>(v));
  }
  const nlohmann::json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    bad(path, where + "data_offsets must be two non-negative integers");
  en.begin = off[0].get<std::uint64_t>();
  en.end = off[1].get<std::uint64_t>();
  if (en.begin > en.end || en.end > data_size)
    bad(path, where + "data_offsets [" + std::to_string(en.begin) + ", " + std::to_string(en.end) +
                  ") outside the " + std::to_string(data_size) +
                  "-byte data section (truncated file?)");
  if (en.end - en.begin != numel * dtype_bytes(en.dtype))
    bad(path, where + "data_offsets span " + std::to_string(en.end - en.begin) +
                  " bytes but shape and dtype " + dt + " need " +
                  std::to_string(numel * dtype_bytes(en.dtype)));
  return en;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
  const HeaderText header = read_header_text(path_);
  data_start_ = header.data_start;
  const std::uint64_t data_size = header.data_size;
  const nlohmann::json j = parse_header(path_, header.json);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    entries_.emplace(name, parse_entry(path_, name, it.value(), data_size));
  }
  check_tiling(path_, entries_, data_size);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) bad(path_, "no tensor '" + name + "'");
  std::int64_t rows = 1, cols = 1;
  if (e->shape.size() == 1) {
    cols = e->shape[0];
  } else if (!e->shape.empty()) {
    rows = e->shape[0];
    for (size_t i = 1; i < e->shape.size(); ++i) cols *= e->shape[i];
  }
  if (rows * cols == 0) {
    TensorSpec shape{name, e->shape, {}};
    bad(path_, "tensor '" + name + "' has the empty shape " + shape.shape_str() +
                   " (every dimension must be at least 1)");
  }
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e->begin));
  std::vector<char> raw(e->end - e->begin);
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!in) bad(path_, "tensor '" + name + "': read failed (file changed or truncated)");
  Mat m(rows, cols);
  float* d = m.data();
  const std::int64_t n = rows * cols;
  if (e->dtype == StDtype::kF32) {
    if (!raw.empty()) std::memcpy(d, raw.data(), raw.size());  // an empty tensor has no data
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      d[i] = e->dtype == StDtype::kBF16 ? std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16)
                                        : half_to_float(h);
    }
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(d[i]))
      bad(path_, "tensor '" + name + "': element " + std::to_string(i) + " is " +
                     (std::isnan(d[i]) ? "NaN" : "infinite") + " (inputs must be finite)");
  return Tensor::from(std::move(m));
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::filesystem::path& path) : path_(path) {
  const std::string name = path.filename().string();
  const std::string suffix = ".index.json";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    shards_.emplace_back(path);
    for (const auto& [t, e] : shards_.back().entries()) shard_of_[t] = 0;
    return;
  }
  require_regular_file(path, "a checkpoint index");  // a FIFO would block the read forever
  std::error_code ec;
  constexpr std::uintmax_t kMaxIndexBytes = std::uintmax_t{64} << 20;
  if (const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
      !ec && bytes > kMaxIndexBytes)
    bad(path, "the checkpoint index is " + std::to_string(bytes) + " bytes; at most " +
                  std::to_string(kMaxIndexBytes) + " are read");
  std::ifstream in(path);
  if (!in) bad(path, "cannot open the checkpoint index");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("the index is not JSON: ") + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    bad(path, "the index has no \"weight_map\" object (tensor name -> shard file)");
  std::map<std::string, size_t> shard_index;  // shard file name -> index in shards_
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    if (!file.is_string()) bad(path, "weight_map[\"" + tensor + "\"] is not a file name");
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos)
      bad(path, "weight_map[\"" + tensor + "\"] = \"" + shard +
                    "\": expected a file name beside the index");
    auto [it, added] = shard_index.emplace(shard, shards_.size());
    if (added) {
      const std::filesystem::path p = path.parent_path() / shard;
      if (!std::filesystem::exists(p))
        bad(path,
            "shard \"" + shard + "\" (of tensor '" + tensor + "') does not exist: " + p.string());
      shards_.emplace_back(p);
    }
    if (shards_[it->second].find(tensor) == nullptr)
      bad(path,
          "the index places tensor '" + tensor + "' in " + shard + ", which does not hold it");
    shard_of_[tensor] = it->second;
  }
}

std::map<std::string, const SafetensorsEntry*> SafetensorsCheckpoint::entries() const {
  std::map<std::string, const SafetensorsEntry*> out;
  for (const auto& [name, shard] : shard_of_) out[name] = shards_[shard].find(name);
  return out;
}

const SafetensorsEntry* SafetensorsCheckpoint::find(const std::string& name) const {
  const auto it = shard_of_.find(name);
  return it == shard_of_.end() ? nullptr : shards_[it->second].find(name);
}

Tensor SafetensorsCheckpoint::read(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) bad(path_, "no tensor '" + name + "'");
  return shards_[it->second].read(name);
}

std::string CheckpointCheck::describe() const {
  std::string s;
  for (const TensorSpec& t : missing)
    s += "missing tensor '" + t.name + "' (expected shape " + t.shape_str() + ")\n";
  for (const std::string& w : wrong_shape) s += "wrong shape: " + w + "\n";
  for (const std::string& e : extra) s += "extra tensor '" + e + "' (not used by the model)\n";
  return s;
}

namespace {
// A tensor name's module with every run of digits as '*' and its last two parts as '*'
// ("transformer_blocks.3.attn.to_q.weight" -> "transformer_blocks.*.attn.*"): the tensors of one
// module, over every block of a kind, share a pattern.
std::string name_pattern(const std::string& name) {
  std::string p;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(name[i])) == 0) {
      p += name[i];
      continue;
    }
    p += '*';
    while (i + 1 < name.size() && std::isdigit(static_cast<unsigned char>(name[i + 1])) != 0) ++i;
  }
  const size_t last = p.rfind('.');
  const size_t second =
      last == std::string::npos || last == 0 ? std::string::npos : p.rfind('.', last - 1);
  if (second != std::string::npos && second > 0) p = p.substr(0, second) + ".*";
  return p;
}

// "pattern (xN)" for each distinct pattern of `names`, in first-seen order, at most `max`.
std::string grouped(const std::vector<std::string>& names, std::size_t max) {
  struct Group {
    std::string pattern, first;
    std::size_t count;
  };
  std::vector<Group> groups;
  for (const std::string& n : names) {
    const std::string p = name_pattern(n);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.pattern == p; });
    if (it == groups.end())
      groups.push_back({p, n, 1});
    else
      ++it->count;
  }
  std::string s;
  for (std::size_t i = 0; i < groups.size() && i < max; ++i) {
    const Group& g = groups[i];
    s += (i ? ", " : "") + ("'" + (g.count > 1 ? g.pattern : g.first) + "'") +
         (g.count > 1 ? " (x" + std::to_string(g.count) + ")" : "");
  }
  if (groups.size() > max) s += ", and " + std::to_string(groups.size() - max) + " more pattern(s)";
  return s;
}
}  // namespace

std::string CheckpointCheck::summary(std::size_t max_patterns) const {
  std::string s = std::to_string(missing.size()) + " missing and " +
                  std::to_string(wrong_shape.size()) + " mis-shaped tensor(s)";
  if (!missing.empty()) {
    std::vector<std::string> names;
    for (const TensorSpec& t : missing) names.push_back(t.name);
    s += "; missing: " + grouped(names, max_patterns);
  }
  if (!wrong_shape.empty()) {
    s += "; mis-shaped: ";
    for (std::size_t i = 0; i < wrong_shape.size() && i < max_patterns; ++i)
      s += (i ? ", " : "") + wrong_shape[i];
    if (wrong_shape.size() > max_patterns)
      s += ", and " + std::to_string(wrong_shape.size() - max_patterns) + " more";
  }
  return s;
}

CheckpointCheck check_checkpoint(const SafetensorsCheckpoint& ckpt,
                                 const std::vector<TensorSpec>& specs) {
  CheckpointCheck c;
  std::map<std::string, const SafetensorsEntry*> present = ckpt.entries();
  for (const TensorSpec& s : specs) {
    const auto it = present.find(s.name);
    if (it == present.end()) {
      c.missing.push_back(s);
      continue;
    }
    if (it->second->shape != s.shape)
      c.wrong_shape.push_back("'" + s.name + "' has shape " +
                              TensorSpec{s.name, it->second->shape, s.init}.shape_str() +
                              ", expected " + s.shape_str());
    present.erase(it);
  }
  for (const auto& [name, e] : present) c.extra.push_back(name);
  return c;
}

std::shared_ptr<const Weights> load_safetensors_weights(const std::filesystem::path& path,
                                                        const std::vector<TensorSpec>& specs) {
  const SafetensorsCheckpoint f(path);
  const CheckpointCheck c = check_checkpoint(f, specs);
  if (!c.ok())
    bad(path,
        c.summary() + " (`cocodiff weights MODEL --check FILE` lists every one with its shape)");
  auto w = std::make_shared<Weights>(false);
  for (const TensorSpec& s : specs) w->add(s, f.read(s.name));
  return w;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorsTensor>& tensors, StDtype dtype) {
  COCO_CHECK(dtype != StDtype::kF16, "write_safetensors: F16 output not supported");
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    std::int64_t numel = 1;
    for (std::int64_t d : t.shape) numel *= d;
    COCO_CHECK(t.tensor != nullptr && !t.tensor->phantom() && numel == t.tensor->numel(),
               "write_safetensors: tensor " + t.name + " shape mismatch or phantom");
    const std::uint64_t bytes = static_cast<std::uint64_t>(numel) * dtype_bytes(dtype);
    header[t.name] = {{"dtype", st_dtype_name(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  // A temporary beside `path`, removed on every failure (write error, failed rename, exception).
  AtomicFile file(path);
  std::ostream& out = file.stream();
  unsigned char len[8];
  std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const SafetensorsTensor& t : tensors) {
    std::span<const float> d = t.tensor->data();
    if (dtype == StDtype::kF32) {
      out.write(reinterpret_cast<const char*>(d.data()),
                static_cast<std::streamsize>(d.size() * 4));
    } else {
      std::vector<std::uint16_t> b(d.size());
      for (size_t i = 0; i < d.size(); ++i) b[i] = float_to_bf16(d[i]);
      out.write(reinterpret_cast<const char*>(b.data()),
                static_cast<std::streamsize>(b.size() * 2));
    }
  }
  file.commit();
}

void write_safetensors(const std::filesystem::path& path, const Weights& weights, StDtype dtype) {
  std::vector<SafetensorsTensor> ts;
  for (const std::string& name : weights.names())
    ts.push_back({name, weights.spec(name).shape, &weights.get(name)});
  write_safetensors(path, ts, dtype);
}

}  // namespace cocodiff::dit
