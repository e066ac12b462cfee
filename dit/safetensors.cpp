#include "dit/safetensors.hpp"

#include <bit>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

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

SafetensorsFile::SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(path_, ec);
  if (ec) bad(path_, "cannot read checkpoint (" + ec.message() + ")");
  if (file_size < 8) bad(path_, "truncated: " + std::to_string(file_size) + " bytes, no header");
  std::ifstream in(path_, std::ios::binary);
  if (!in) bad(path_, "cannot open checkpoint");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    bad(path_, "header claims " + std::to_string(header_len) + " bytes but the file has " +
                   std::to_string(file_size - 8) +
                   " after the length field (truncated or not a "
                   "safetensors file)");
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in) bad(path_, "truncated header");
  data_start_ = 8 + header_len;
  const std::uint64_t data_size = file_size - data_start_;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    bad(path_, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path_, "header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const nlohmann::json& e = it.value();
    const std::string where = "tensor '" + name + "': ";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets"))
      bad(path_, where + "expected {dtype, shape, data_offsets}");
    SafetensorsEntry en;
    if (!e["dtype"].is_string()) bad(path_, where + "dtype is not a string");
    const std::string dt = e["dtype"].get<std::string>();
    if (dt == "F32")
      en.dtype = StDtype::kF32;
    else if (dt == "F16")
      en.dtype = StDtype::kF16;
    else if (dt == "BF16")
      en.dtype = StDtype::kBF16;
    else
      bad(path_, where + "unsupported dtype " + dt + " (expected F32, F16 or BF16)");
    if (!e["shape"].is_array()) bad(path_, where + "shape is not an array");
    std::uint64_t numel = 1;
    for (const nlohmann::json& d : e["shape"]) {
      if (!d.is_number_unsigned())
        bad(path_, where + "shape entries must be non-negative integers");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v != 0 && numel > data_size / v) bad(path_, where + "shape larger than the file");
      numel *= v;
      en.shape.push_back(static_cast<std::int64_t>(v));
    }
    const nlohmann::json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad(path_, where + "data_offsets must be two non-negative integers");
    en.begin = off[0].get<std::uint64_t>();
    en.end = off[1].get<std::uint64_t>();
    if (en.begin > en.end || en.end > data_size)
      bad(path_, where + "data_offsets [" + std::to_string(en.begin) + ", " +
                     std::to_string(en.end) + ") outside the " + std::to_string(data_size) +
                     "-byte data section (truncated file?)");
    if (en.end - en.begin != numel * dtype_bytes(en.dtype))
      bad(path_, where + "data_offsets span " + std::to_string(en.end - en.begin) +
                     " bytes but shape and dtype " + dt + " need " +
                     std::to_string(numel * dtype_bytes(en.dtype)));
    entries_.emplace(name, std::move(en));
  }
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
  return Tensor::from(std::move(m));
}

std::shared_ptr<const Weights> load_safetensors_weights(const std::filesystem::path& path,
                                                        const std::vector<TensorSpec>& specs) {
  const SafetensorsFile f(path);
  auto w = std::make_shared<Weights>(false);
  for (const TensorSpec& s : specs) {
    const SafetensorsEntry* e = f.find(s.name);
    if (e == nullptr)
      bad(path, "missing tensor '" + s.name + "' (the model expects shape " + s.shape_str() + ")");
    if (e->shape != s.shape) {
      TensorSpec found{s.name, e->shape, s.init};
      bad(path,
          "tensor '" + s.name + "' has shape " + found.shape_str() + ", expected " + s.shape_str());
    }
    w->add(s, f.read(s.name));
  }
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
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(tmp.string() + ": cannot open for writing");
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
    if (!out) throw InputError(tmp.string() + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError(path.string() + ": cannot rename into place (" + ec.message() + ")");
}

void write_safetensors(const std::filesystem::path& path, const Weights& weights, StDtype dtype) {
  std::vector<SafetensorsTensor> ts;
  for (const std::string& name : weights.names())
    ts.push_back({name, weights.spec(name).shape, &weights.get(name)});
  write_safetensors(path, ts, dtype);
}

}  // namespace cocodiff::dit
