// safetensors round trips and every loader error.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.hpp"
#include "dit/model.hpp"
#include "dit/pipeline.hpp"
#include "dit/safetensors.hpp"

namespace cocodiff::dit {
namespace {

namespace fs = std::filesystem;

fs::path tmp(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "cocodiff_st_test";
  fs::create_directories(d);
  return d / name;
}

// A raw file: 8-byte length + header + data bytes.
void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes) {
  std::ofstream out(p, std::ios::binary);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  for (std::size_t i = 0; i < data_bytes; ++i) out.put('\0');
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Safetensors, RoundTripF32AndBf16) {
  Mat m(2, 3);
  m << 1, -2.5, 3.25, 1e-3f, 65504, -0.0f;
  const Tensor t = Tensor::from(m);
  const fs::path f32 = tmp("rt32.safetensors"), b16 = tmp("rt16.safetensors");
  write_safetensors(f32, {{"a.weight", {2, 3}, &t}, {"b", {6}, &t}});
  write_safetensors(b16, {{"a.weight", {2, 1, 3}, &t}}, StDtype::kBF16);
  const SafetensorsFile f(f32);
  EXPECT_EQ(f.entries().size(), 2u);
  EXPECT_EQ((f.read("a.weight").mat() - m).norm(), 0.0f);
  EXPECT_EQ(f.read("b").rows(), 1);
  EXPECT_EQ(f.read("b").cols(), 6);
  const SafetensorsFile g(b16);
  EXPECT_EQ(g.find("a.weight")->dtype, StDtype::kBF16);
  const Mat back = g.read("a.weight").mat();
  EXPECT_EQ(back(0, 0), 1.0f);
  EXPECT_EQ(back(0, 1), -2.5f);
  EXPECT_NEAR(back(1, 0), 1e-3f, 1e-5f);  // bf16 keeps 8 mantissa bits
  EXPECT_NE(back(1, 0), 1e-3f);
}

TEST(Safetensors, F16IsConverted) {
  // 1.0 = 0x3C00, -2.0 = 0xC000, 65504 = 0x7BFF, smallest subnormal 2^-24 = 0x0001.
  const fs::path p = tmp("f16.safetensors");
  const std::string h = R"({"x":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})";
  {
    std::ofstream out(p, std::ios::binary);
    std::uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << h;
    const unsigned char d[8] = {0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00};
    out.write(reinterpret_cast<const char*>(d), 8);
  }
  const Tensor t = SafetensorsFile(p).read("x");
  EXPECT_EQ(t.mat()(0, 0), 1.0f);
  EXPECT_EQ(t.mat()(0, 1), -2.0f);
  EXPECT_EQ(t.mat()(0, 2), 65504.0f);
  EXPECT_EQ(t.mat()(0, 3), std::ldexp(1.0f, -24));
}

TEST(Safetensors, ModelWeightsRoundTripByUpstreamNames) {
  for (const char* preset : {"dit-xl-2-tiny", "flux1-tiny", "flux2-tiny"}) {
    const ModelConfig cfg = load_model_preset(preset);
    const auto w = make_weights(cfg, 11, false);
    const fs::path p = tmp(std::string(preset) + ".safetensors");
    write_safetensors(p, *w);
    const auto back = load_weights(cfg, p);
    ASSERT_EQ(back->size(), w->size());
    for (const std::string& n : w->names())
      ASSERT_EQ((back->get(n).mat() - w->get(n).mat()).norm(), 0.0f) << n;
  }
}

TEST(Safetensors, LoaderErrors) {
  const ModelConfig cfg = load_model_preset("dit-xl-2-tiny");
  const auto w = make_weights(cfg, 11, false);
  const fs::path good = tmp("good.safetensors");
  write_safetensors(good, *w);

  // Missing tensor: a checkpoint without one of the model's tensors.
  {
    std::vector<SafetensorsTensor> ts;
    for (const std::string& n : w->names())
      if (n != "blocks.1.mlp.fc2.weight") ts.push_back({n, w->spec(n).shape, &w->get(n)});
    const fs::path p = tmp("missing.safetensors");
    write_safetensors(p, ts);
    const std::string e = error_of([&] { load_weights(cfg, p); });
    EXPECT_NE(e.find("1 missing and 0 mis-shaped tensor(s); missing: 'blocks.1.mlp.fc2.weight'"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("missing.safetensors"), std::string::npos) << e;
  }
  // Wrong shape: same element count, different shape.
  {
    std::vector<SafetensorsTensor> ts;
    for (const std::string& n : w->names()) {
      std::vector<std::int64_t> shape = w->spec(n).shape;
      if (n == "final_layer.linear.weight") shape = {shape[1], shape[0]};
      ts.push_back({n, shape, &w->get(n)});
    }
    const fs::path p = tmp("shape.safetensors");
    write_safetensors(p, ts);
    const std::string e = error_of([&] { load_weights(cfg, p); });
    EXPECT_NE(e.find("'final_layer.linear.weight' has shape [192, 32], expected [32, 192]"),
              std::string::npos)
        << e;
  }
  // Truncated file: cut the last bytes off a good one.
  {
    const fs::path p = tmp("truncated.safetensors");
    fs::copy_file(good, p, fs::copy_options::overwrite_existing);
    fs::resize_file(p, fs::file_size(p) - 100);
    const std::string e = error_of([&] { SafetensorsFile f(p); });
    EXPECT_NE(e.find("outside the"), std::string::npos) << e;
    const fs::path q = tmp("tiny.safetensors");
    write_raw(q, "", 0);
    fs::resize_file(q, 5);
    EXPECT_NE(error_of([&] { SafetensorsFile f(q); }).find("truncated"), std::string::npos);
  }
  // A header that lies about its own size, or a tensor whose offsets disagree with its shape
  // (never allocated: validated against the file size first).
  {
    const fs::path p = tmp("liar.safetensors");
    {
      std::ofstream out(p, std::ios::binary);
      const std::uint64_t n = std::uint64_t{1} << 40;  // claims a 1 TiB header
      for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
      out << "{}";
    }
    EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("header claims"), std::string::npos);
    write_raw(p, R"({"x":{"dtype":"F32","shape":[1000000000,1000000000],"data_offsets":[0,16]}})",
              16);
    EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("larger than the file"),
              std::string::npos);
    write_raw(p, R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16);
    EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("need 16"), std::string::npos);
    write_raw(p, R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})", 16);
    EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("not valid JSON"), std::string::npos);
  }
  // Wrong dtype.
  {
    const fs::path p = tmp("dtype.safetensors");
    write_raw(p, R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
    const std::string e = error_of([&] { SafetensorsFile f(p); });
    EXPECT_NE(e.find("unsupported dtype I64"), std::string::npos) << e;
  }
  // Not there at all.
  EXPECT_NE(error_of([&] { SafetensorsFile f(tmp("nope.safetensors")); }).find("cannot read"),
            std::string::npos);
  // A FIFO (or any file that is not a regular one) is refused before it is opened: reading one
  // would block for ever.
  for (const std::string name : {"fifo.safetensors", "fifo.safetensors.index.json"}) {
    const fs::path p = tmp(name);
    fs::remove(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    const std::string e = error_of([&] { SafetensorsCheckpoint c(p); });
    EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
    fs::remove(p);
  }
}

// A header of n one-element tensors, tiling 4n bytes of data.
std::string many_tensors_header(int n) {
  std::string h = "{";
  for (int i = 0; i < n; ++i)
    h += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
         "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) + "," +
         std::to_string(4 * i + 4) + "]}";
  return h + "}";
}

double cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The header is read in time linear in its size: four times the tensors cost about four times
// the CPU time, not sixteen (the duplicate-name check once scanned the whole object at every
// entry's end: 64k tensors took 50 s). The least of three reads of each, in one process.
TEST(Safetensors, ManyTensorHeadersReadInLinearTime) {
  const int n = 8000;
  const fs::path small = tmp("many_small.safetensors"), large = tmp("many_large.safetensors");
  write_raw(small, many_tensors_header(n), 4 * static_cast<size_t>(n));
  write_raw(large, many_tensors_header(4 * n), 16 * static_cast<size_t>(n));
  auto least = [](const fs::path& p, size_t expect) {
    double best = 1e300;
    for (int k = 0; k < 5; ++k) {  // the least of five: a loaded machine inflates some
      const double t0 = cpu_seconds();
      const SafetensorsFile f(p);
      best = std::min(best, cpu_seconds() - t0);
      EXPECT_EQ(f.entries().size(), expect);
    }
    return best;
  };
  const double t_small = least(small, n), t_large = least(large, 4 * static_cast<size_t>(n));
  EXPECT_LT(t_large, 9 * std::max(t_small, 1e-3)) << t_small << " s, then " << t_large << " s";
  // A duplicate name among them is still found.
  std::string dup = many_tensors_header(3);
  dup.replace(dup.find("\"t2\""), 4, "\"t0\"");
  write_raw(small, dup, 12);
  EXPECT_NE(error_of([&] { SafetensorsFile f(small); }).find("'t0' is listed twice"),
            std::string::npos);
  fs::remove(small);
  fs::remove(large);
}

// A sharded checkpoint (index + shards, as upstream repositories ship large models) loads to
// the same tensors as the single file; a bad index is an InputError naming the index.
TEST(Safetensors, ShardedIndexLoadsLikeOneFile) {
  const ModelConfig cfg = load_model_preset("dit-xl-2-tiny");
  const auto w = make_weights(cfg, 5, false);
  const fs::path single = tmp("single.safetensors");
  write_safetensors(single, *w);
  std::vector<SafetensorsTensor> shard[2];
  std::string map;
  int i = 0;
  for (const std::string& n : w->names()) {
    const int s = i++ % 2;
    shard[s].push_back({n, w->spec(n).shape, &w->get(n)});
    map += std::string(map.empty() ? "" : ",") + "\"" + n + "\":\"model-0000" +
           std::to_string(s + 1) + "-of-00002.safetensors\"";
  }
  write_safetensors(tmp("model-00001-of-00002.safetensors"), shard[0]);
  write_safetensors(tmp("model-00002-of-00002.safetensors"), shard[1]);
  const fs::path index = tmp("model.safetensors.index.json");
  std::ofstream(index) << "{\"metadata\":{},\"weight_map\":{" << map << "}}";

  const auto a = load_weights(cfg, single);
  const auto b = load_weights(cfg, index);
  ASSERT_EQ(a->names(), b->names());
  for (const std::string& n : a->names()) EXPECT_TRUE(a->get(n).mat() == b->get(n).mat()) << n;

  const fs::path bad = tmp("bad.safetensors.index.json");
  std::ofstream(bad) << "{\"weight_map\":{\"x\":\"absent.safetensors\"}}";
  EXPECT_NE(error_of([&] { load_weights(cfg, bad); }).find("shard \"absent.safetensors\""),
            std::string::npos);
  std::ofstream(bad) << "{\"no_map\":1}";
  EXPECT_NE(error_of([&] { load_weights(cfg, bad); }).find("no \"weight_map\""), std::string::npos);
}

}  // namespace
}  // namespace cocodiff::dit
