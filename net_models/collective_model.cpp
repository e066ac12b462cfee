#include "net_models/collective_model.hpp"

#include "core/errors.hpp"

namespace cocodiff {

bool LibraryModel::is_free() const {
  const SimTime zero;
  return call_overhead == zero && message_overhead == zero && eager_overhead == zero &&
         rendezvous_overhead == zero && chunk_overhead == zero && eager_copy_bytes_per_s == 0 &&
         local_copy_bytes_per_s == 0;
}

SimTime local_copy_time(const LibraryModel& lib, std::int64_t wire_bytes) {
  if (lib.local_copy_bytes_per_s <= 0 || wire_bytes <= 0) return SimTime{};
  return SimTime::from_seconds(static_cast<double>(wire_bytes) / lib.local_copy_bytes_per_s);
}

SimTime message_software_time(const LibraryModel& lib, std::int64_t wire_bytes) {
  SimTime t = lib.message_overhead;
  if (wire_bytes <= lib.eager_max_bytes) {
    t += lib.eager_overhead;
    if (lib.eager_copy_bytes_per_s > 0 && wire_bytes > 0)
      t += SimTime::from_seconds(static_cast<double>(wire_bytes) / lib.eager_copy_bytes_per_s);
  } else {
    t += lib.rendezvous_overhead;
  }
  if (lib.chunk_bytes > 0 && wire_bytes > lib.chunk_bytes) {
    const std::int64_t chunks = (wire_bytes + lib.chunk_bytes - 1) / lib.chunk_bytes;
    t += SimTime::from_ns(lib.chunk_overhead.ns() * (chunks - 1));
  }
  return t;
}

const std::string& choose_all_to_all(const LibraryModel& lib, std::int64_t wire_bytes_per_peer) {
  return lib.small_all_to_all(wire_bytes_per_peer) ? lib.all_to_all_small : lib.all_to_all_large;
}

}  // namespace cocodiff
